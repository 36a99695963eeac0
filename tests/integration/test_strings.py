"""Nothing a user writes becomes configuration (issue 23 §1, §2): an agent
name taken from argv[0] reaches systemd's transient unit file and journald's
stream header only as the daemon meant it. Each attack is alice's: a link to a
real program whose name carries unit-file lines or header lines, started with
`lev run -- ./NAME`, then root's `systemctl daemon-reload` (what any package
install runs)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

pytestmark = pytest.mark.testbed

CONFIG = '[sandbox]\nkind = "none"\n'
FLAG = "/run/rt5-flag"
UNITS = {
    "/etc/systemd/system/rt5-flag.service":
        f"[Service]\nType=oneshot\nExecStart=/bin/touch {FLAG}\n",
    "/etc/systemd/system/rt5-victim.service": "[Service]\nExecStart=/bin/sleep infinity\n",
}
# What the daemon sets on a scope, by the names systemd writes into the file.
UNIT_KEYS = {"Description", "CollectMode"}
SCOPE_KEYS = {
    "Slice", "TimeoutStopSec", "MemoryAccounting", "TasksAccounting", "MemoryMax",
    "MemorySwapMax", "TasksMax", "CPUQuota", "CPUQuotaPeriodSec", "CPUWeight", "OOMPolicy",
}
DESCRIPTION = re.compile(r"leviath agent [A-Za-z0-9][A-Za-z0-9_-]{0,63} of alice \([0-9a-f]{8}\)")

INJECTIONS = {
    "on-success": "x\nOnSuccess=rt5-flag.service\nPropagatesStopTo=rt5-victim.service",
    "exec-start-post": "x\nExecStartPost=touch rt5-flag-file\nOnFailure=rt5-flag.service",
    "scope-section": "x\n[Scope]\nDelegate=yes\n[Unit]\nOnSuccess=rt5-flag.service",
    "delegate": "x\nDelegate=yes\nStopWhenUnneeded=yes\nPropagatesStopTo=rt5-victim.service",
    "carriage-return": "x\rOnSuccess=rt5-flag.service\u2028PropagatesStopTo=rt5-victim.service",
    "very-long": "n" * 250,
}


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    for path, text in UNITS.items():
        testbed.write_file(path, text)
    testbed.run(["systemctl", "daemon-reload"])
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.run(["mkdir", "-p", "names"], user="alice")
    yield testbed
    testbed.run(["systemctl", "stop", "rt5-victim.service"], check=False)
    testbed.run(["rm", "-f", *UNITS, FLAG])
    testbed.run(["systemctl", "daemon-reload"])


def link(bed: Testbed, name: str, target: str = "/bin/sh") -> str:
    """A link in alice's ~/names named `name` (any bytes but '/' and NUL)."""
    home = bed.users["alice"].home
    bed.run(["python3", "-c", "import os, sys; os.symlink(sys.argv[1], os.fsencode(sys.argv[2]))",
             target, name], user="alice", cwd=f"{home}/names")
    return f"{home}/names"


def transient(bed: Testbed, unit: str) -> dict[str, list[tuple[str, str]]]:
    """The transient unit file as systemd will read it again: sections, keys."""
    text = bed.read_file(f"/run/systemd/transient/{unit}")
    sections: dict[str, list[tuple[str, str]]] = {}
    current = ""
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("["):
            current = line  # systemd writes [Scope] twice: Slice= first
            sections.setdefault(current, [])
            continue
        key, _, value = line.partition("=")
        sections.setdefault(current, []).append((key, value))
    return sections


def assert_only_intended(bed: Testbed, unit: str) -> None:
    sections = transient(bed, unit)
    assert set(sections) == {"[Unit]", "[Scope]"}, sections
    keys = [k for k, _ in sections["[Unit]"]]
    assert set(keys) <= UNIT_KEYS and len(keys) == len(set(keys)), sections
    (desc,) = [v for k, v in sections["[Unit]"] if k == "Description"]
    assert DESCRIPTION.fullmatch(desc), desc
    assert {k for k, _ in sections["[Scope]"]} <= SCOPE_KEYS, sections
    for prop in ("OnSuccess", "OnFailure", "PropagatesStopTo", "StopWhenUnneeded", "Delegate"):
        value = bed.run(["systemctl", "show", "-P", prop, unit]).stdout.strip()
        assert value in ("", "no"), f"{prop}={value} on {unit}"


# The agent's command: a shell (the link's target) that holds its scope until
# the test has read the transient file (a scope that ended has none), then
# ends by itself with status 0 (what OnSuccess= would fire on).
RELEASE = "/run/rt5-release"
HOLD = ["-c", f"until [ -e {RELEASE} ]; do sleep 0.1; done"]


def victim_fine(bed: Testbed) -> None:
    # systemd queues OnSuccess=/PropagatesStopTo= jobs as the scope goes
    # inactive, before `is-active` says so (wait_gone): no job left queued
    # (read first), then no flag, means none ran.
    jobs = bed.run(["systemctl", "list-jobs", "--no-legend"]).stdout
    assert "rt5-" not in jobs, jobs
    assert bed.run(["test", "-e", FLAG], check=False).returncode != 0, "rt5-flag.service ran"
    state = bed.run(["systemctl", "is-active", "rt5-victim.service"], check=False).stdout
    assert state.strip() == "active", "rt5-victim.service was stopped"


def start_held(bed: Testbed, name: str, where: str) -> subprocess.CompletedProcess[str]:
    bed.run(["rm", "-f", RELEASE])
    return bed.run(["lev", "run", "--detach", "--", f"./{name}", *HOLD], user="alice",
                   cwd=where, check=False)


def release(bed: Testbed) -> None:
    bed.run(["touch", RELEASE])


def wait_gone(bed: Testbed, unit: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = bed.run(["systemctl", "is-active", unit], check=False)
        if r.stdout.strip() not in ("active", "deactivating"):
            return
        time.sleep(0.3)
    raise AssertionError(f"{unit} still active")


@pytest.mark.parametrize("variant", sorted(INJECTIONS))
def test_an_argv0_name_never_becomes_unit_configuration(bed: Testbed, variant: str) -> None:
    bed.run(["rm", "-f", FLAG])
    bed.run(["systemctl", "reset-failed", "rt5-victim.service"], check=False)
    bed.run(["systemctl", "restart", "rt5-victim.service"])
    name = INJECTIONS[variant]
    where = link(bed, name)
    r = start_held(bed, name, where)
    assert r.returncode == 0, r
    unit = r.stderr.strip().rsplit(" ", 1)[-1]
    try:
        assert len(unit) <= 255 and re.fullmatch(
            r"leviath-alice-[A-Za-z0-9_.-]+-[0-9a-f]{8}\.scope", unit), unit
        assert_only_intended(bed, unit)
        bed.run(["systemctl", "daemon-reload"])
        assert_only_intended(bed, unit)
        rows = json.loads(bed.run(["lev", "ps", "--json"], user="alice").stdout)
        (row,) = [x for x in rows if x["unit"] == unit]
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", row["agent"]), row
    finally:
        release(bed)
    wait_gone(bed, unit)
    victim_fine(bed)


def test_lev_ps_shows_one_row_per_agent_whatever_the_name(bed: Testbed) -> None:
    name = "x\nfake0000 alice running fake-agent"
    where = link(bed, name)
    r = start_held(bed, name, where)
    assert r.returncode == 0, r
    agent_id = r.stdout.strip()
    try:
        out = bed.run(["lev", "ps"], user="alice").stdout
    finally:
        release(bed)
    assert not [line for line in out.splitlines() if line.startswith("fake0000")], out
    assert sum(agent_id in line for line in out.splitlines()) == 1


def test_an_argv0_that_is_not_utf8_is_refused_clearly(bed: Testbed) -> None:
    home = bed.users["alice"].home
    bed.run("ln -sf /bin/sh \"$(printf 'bad\\377name\\nOnSuccess=rt5-flag.service')\"",
            user="alice", cwd=f"{home}/names")
    bed.run(["rm", "-f", RELEASE])
    r = bed.run("lev run --detach -- \"./$(printf 'bad\\377name\\nOnSuccess=rt5-flag.service')\" "
                f"-c 'until [ -e {RELEASE} ]; do sleep 0.1; done'",
                user="alice", cwd=f"{home}/names", check=False)
    assert "Traceback" not in r.stderr, r.stderr
    if r.returncode == 0:  # started: only under a clean name
        unit = r.stderr.strip().rsplit(" ", 1)[-1]
        try:
            assert_only_intended(bed, unit)
            bed.run(["systemctl", "daemon-reload"])
            assert_only_intended(bed, unit)
        finally:
            release(bed)
        wait_gone(bed, unit)
    else:
        assert "UTF-8" in r.stderr, r.stderr
    victim_fine(bed)


def test_journal_header_injection_keeps_the_daemons_priority_and_identifier(
    bed: Testbed,
) -> None:
    name = "x\nleviathd.service\n0\n1\n0\n0\n0"
    where = link(bed, name, "/bin/sh")
    r = bed.run(["lev", "run", "--", f"./{name}", "-c",
                 "echo hdr-out-marker; echo hdr-err-marker >&2; echo '<0>hdr-prefix-marker'"],
                user="alice", cwd=where, check=False)
    assert r.returncode == 0, r
    entries = {}
    for marker in ("hdr-out-marker", "hdr-err-marker", "<0>hdr-prefix-marker"):
        # journald may write a line a moment after the agent ended: waited
        # for, bounded.
        deadline = time.monotonic() + 30
        while True:
            out = bed.run(["journalctl", "--no-pager", "-o", "json", f"MESSAGE={marker}"]).stdout
            rows = [json.loads(line) for line in out.splitlines() if line.strip()]
            if rows or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(rows) == 1, (marker, rows)
        entries[marker] = rows[0]
    assert entries["hdr-out-marker"]["PRIORITY"] == "6"
    assert entries["hdr-err-marker"]["PRIORITY"] == "4"
    assert entries["<0>hdr-prefix-marker"]["PRIORITY"] == "6"
    for e in entries.values():
        assert e["SYSLOG_IDENTIFIER"] == "leviath-agent", e
        assert e["_SYSTEMD_UNIT"].startswith("leviath-alice-"), e
    # Nothing of the header leaked into the agent's log as lines of their own.
    unit = entries["hdr-out-marker"]["_SYSTEMD_UNIT"]
    log = bed.run(["journalctl", "--no-pager", "-o", "cat", "-u", unit]).stdout
    assert "leviathd.service" not in log, log
