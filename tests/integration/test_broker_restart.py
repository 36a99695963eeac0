"""Tool calls across a daemon restart (issue 24 §1): an agent calling tools in
a loop while `systemctl restart leviathd` runs sees no call fail; its broker
client waits, bounded, for the new daemon instead of failing at once with
"cannot reach the broker"."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

pytestmark = pytest.mark.testbed

CONFIG = """
[sandbox]
kind = "namespace"
"""
LOOP = (
    "n=0; fails=0; "
    "while [ ! -e stop ]; do "
    "if lev tool read_file small.txt >/dev/null 2>>errs; then :; else fails=$((fails+1)); fi; "
    "n=$((n+1)); done; echo \"$n $fails\" > result"
)


@pytest.fixture
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.run(["mkdir", "-p", "restart-work"], user="alice")
    yield testbed
    testbed.run(["rm", "-rf", f"{testbed.users['alice'].home}/restart-work"], check=False)


def test_tool_calls_in_a_loop_survive_daemon_restarts(bed: Testbed) -> None:
    work = f"{bed.users['alice'].home}/restart-work"
    bed.run(["sh", "-c", "echo hello > small.txt; rm -f stop result errs"], user="alice",
            cwd=work)
    agent = bed.run(["lev", "run", "--detach", "--", "sh", "-c", LOOP], user="alice",
                    cwd=work).stdout.strip()
    try:
        time.sleep(2)
        for _ in range(3):
            bed.run(["systemctl", "restart", "leviathd"])
            time.sleep(1.5)
        bed.run(["touch", "stop"], user="alice", cwd=work)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if bed.run(["test", "-s", f"{work}/result"], check=False).returncode == 0:
                break
            time.sleep(0.3)
        calls, fails = map(int, bed.read_file(f"{work}/result").split())
        errs = bed.run(["cat", f"{work}/errs"], check=False).stdout
        assert calls > 10, (calls, errs)
        assert fails == 0, f"{fails} of {calls} calls failed:\n{errs[-2000:]}"
    finally:
        bed.run(["touch", "stop"], user="alice", cwd=work, check=False)
        bed.run(["lev", "stop", agent], user="alice", cwd=work, check=False)
