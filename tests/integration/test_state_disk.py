"""A full state filesystem (issue 17 §6): `lev run` is told so by name, and an
agent that ends while /var/lib/leviath is full keeps its exit status, in the
daemon's memory and over a daemon restart, until it is written once space
returns. Provoked for real: a 2 MB tmpfs over /var/lib/leviath, filled."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

pytestmark = pytest.mark.testbed

STATE = "/var/lib/leviath"
# The agents' scratch (an image file each, sandbox/loopfs.py) elsewhere: on
# the filled state disk it would hold space of its own, and this test is
# about the records.
CONFIG = """
[sandbox]
kind = "namespace"
scratch_dir = "/var/tmp/leviath-state-disk-scratch"
"""


@pytest.fixture
def small_state(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    testbed.run(["mkdir", "-p", "work"], user="alice")
    testbed.run(["systemctl", "stop", "leviathd"])
    testbed.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0711", "leviath-small", STATE])
    testbed.run(["systemctl", "start", "leviathd"])
    try:
        yield testbed
    finally:
        testbed.run(["systemctl", "stop", "leviathd"], check=False)
        testbed.run(["umount", "-l", STATE], check=False)
        testbed.run(["systemctl", "reset-failed", "leviathd"], check=False)
        testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
        testbed.run(["systemctl", "start", "leviathd"])


def lev(bed: Testbed, *args: str, check: bool = True):
    return bed.run(["lev", *args], user="alice", cwd=f"{bed.users['alice'].home}/work",
                   check=check, timeout=60)


def row(bed: Testbed, agent: str) -> dict:
    return {r["id"]: r for r in json.loads(lev(bed, "ps", "--all", "--json").stdout)}[agent]


def fill(bed: Testbed) -> None:
    bed.run(["sh", "-c", f"cat /dev/zero >> {STATE}/fill"], check=False)
    assert bed.run(["sh", "-c", f"echo x > {STATE}/probe"], check=False).returncode != 0


def wait_for(pred, what: str, seconds: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_full_state_disk_is_named_and_loses_no_exit_status(small_state: Testbed) -> None:
    bed = small_state
    work = f"{bed.users['alice'].home}/work"
    bed.run(["rm", "-f", f"{work}/go"])
    agent = lev(bed, "run", "--detach", "--", "sh", "-c",
                "while [ ! -e go ]; do sleep 0.1; done; exit 7").stdout.strip()
    try:
        fill(bed)
        # A run is refused by name, not as an internal error.
        r = lev(bed, "run", "--", "true", check=False)
        assert r.returncode != 0
        assert f"no space left in {STATE}" in r.stderr, r.stderr
        assert "internal error" not in r.stderr
        # The agent ends while the disk is full: its end is known at once.
        fill(bed)
        bed.run(["touch", f"{work}/go"], user="alice")
        wait_for(lambda: row(bed, agent)["state"] != "running", "the agent's end")
        got = row(bed, agent)
        assert (got["state"], got.get("exit_status")) == ("exited", 7), got
        # A daemon restart while still full keeps it (the end's clean-up may
        # have freed a page or two).
        fill(bed)
        bed.run(["systemctl", "restart", "leviathd"])
        got = row(bed, agent)
        assert (got["state"], got.get("exit_status")) == ("exited", 7), got
        on_disk = json.loads(bed.read_file(f"{STATE}/agents/{agent}.json"))
        assert on_disk["state"] == "running"
        # Space returns: the record is written without anyone asking.
        bed.run(["rm", "-f", f"{STATE}/fill"])

        def written() -> bool:
            rec = json.loads(bed.read_file(f"{STATE}/agents/{agent}.json"))
            return bool(rec["state"] == "exited" and rec["exit_status"] == 7)

        wait_for(written, "the record written once space returned")
        journal = bed.run(["journalctl", "-u", "leviathd", "-n", "200", "-o", "cat"]).stdout
        assert f"no space left in {STATE}" in journal
        # And new agents start again.
        lev(bed, "run", "--", "true")
    finally:
        bed.run(["rm", "-f", f"{STATE}/fill", f"{work}/go"], check=False)
        lev(bed, "stop", agent, check=False)
