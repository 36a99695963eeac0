"""Every way of reloading the machine configuration leaves the same journal
record (leviathd/config/reload.py): `systemctl reload` (SIGHUP) and the bus's
Reload each write `LEVIATH_EVENT=reload` with the cause, and the bus's with
who asked. Before, SIGHUP wrote only an unstructured log line, and the bus's
Reload a record without either field."""

from __future__ import annotations

import json
import time

import pytest
from testbed import Testbed

RELOAD = ["busctl", "call", "org.leviath.Manager1", "/org/leviath/Manager1",
          "org.leviath.Manager1", "Reload"]


def _reloads(bed: Testbed) -> dict[str, dict[str, str]]:
    out = bed.run(["journalctl", "-u", "leviathd", "-o", "json", "--no-pager",
                   "LEVIATH_EVENT=reload"], check=False).stdout
    records = (json.loads(line) for line in out.splitlines() if line)
    return {r["__CURSOR"]: r for r in records}


def _next_reload(bed: Testbed, before: dict[str, dict[str, str]]) -> dict[str, str]:
    """The daemon's record of the reload just asked for (the bound only ends
    a test whose daemon never records it)."""
    for _ in range(300):
        new = [r for c, r in _reloads(bed).items() if c not in before]
        if new:
            return new[-1]
        time.sleep(0.1)
    pytest.fail("no reload record:\n" + bed.journal("leviathd.service", lines=30))


def test_sighup_and_the_bus_reload_leave_one_record_shape(testbed: Testbed) -> None:
    testbed.start_service("leviathd.service")
    before = _reloads(testbed)
    testbed.run(["systemctl", "reload", "leviathd"])
    signal = _next_reload(testbed, before)
    assert signal.get("LEVIATH_RELOAD_CAUSE") == "signal", signal
    assert "LEVIATH_BY_UID" not in signal
    before = _reloads(testbed)
    testbed.run(RELOAD)
    bus = _next_reload(testbed, before)
    assert bus.get("LEVIATH_RELOAD_CAUSE") == "bus", bus
    assert bus.get("LEVIATH_BY_UID") == "0", bus
    for r in (signal, bus):
        assert r["MESSAGE"].endswith("configuration reloaded"), r["MESSAGE"]
        assert r["SYSLOG_IDENTIFIER"] == "leviathd"
