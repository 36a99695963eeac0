"""Edits to the machine config and to rules.d take effect without a reload
where inotify-simple is missing, as on every Debian release (issue 33 item
5: the packaged daemon used to log "inotify_simple is not installed" and
watch nothing). The bed's venv has the package, so the daemon runs here with
an `inotify_simple` on its path that cannot be imported, as on Debian."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

DROP_IN = "/etc/systemd/system/leviathd.service.d/60-no-inotify-simple.conf"
SHADOW = "/usr/local/lib/leviath-test-no-inotify-simple"
CONFIG = "/etc/leviath/config.toml"
RULES = "/etc/leviath/rules.d/60-watch-test.toml"


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file(f"{SHADOW}/inotify_simple.py",
                       'raise ImportError("not packaged by Debian (test stand-in)")\n')
    testbed.write_file(DROP_IN, f"[Service]\nEnvironment=PYTHONPATH={SHADOW}\n")
    testbed.write_file(CONFIG, '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "daemon-reload"])
    testbed.run(["systemctl", "restart", "leviathd"])
    try:
        yield testbed
    finally:
        testbed.run(["rm", "-rf", DROP_IN, SHADOW, RULES])
        testbed.run(["systemctl", "daemon-reload"])
        testbed.run(["systemctl", "restart", "leviathd"])


def _reloads(bed: Testbed) -> list[str]:
    out = bed.run(["journalctl", "-u", "leviathd", "-o", "json", "--no-pager",
                   "LEVIATH_EVENT=reload"], check=False).stdout
    return [json.loads(line).get("__CURSOR", "") for line in out.splitlines() if line]


def _wait_for_a_new_reload(bed: Testbed, before: list[str]) -> None:
    """Waits for the daemon's own record of the reload (not a timed check:
    the bound only ends a test whose daemon never reloads)."""
    for _ in range(300):
        if set(_reloads(bed)) - set(before):
            return
        time.sleep(0.1)
    pytest.fail("the daemon did not re-read its config after the edit:\n"
                + bed.journal("leviathd.service", lines=30))


def test_an_edit_of_the_machine_config_is_read_without_a_reload(bed: Testbed) -> None:
    pid = bed.run(["systemctl", "show", "-P", "MainPID", "leviathd"]).stdout.strip()
    before = _reloads(bed)
    bed.write_file(CONFIG, '[sandbox]\nkind = "namespace"\nscratch_size = "900M"\n')
    _wait_for_a_new_reload(bed, before)
    # The same daemon: no restart did it.
    assert bed.run(["systemctl", "show", "-P", "MainPID", "leviathd"]).stdout.strip() == pid
    journal = bed.journal("leviathd.service", lines=200)
    assert "inotify_simple is not installed" not in journal


def test_a_new_rules_file_is_read_without_a_reload(bed: Testbed) -> None:
    before = _reloads(bed)
    bed.write_file(RULES, "")
    _wait_for_a_new_reload(bed, before)
