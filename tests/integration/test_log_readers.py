"""Issue 9 §4: every Logs(follow=true) (and Audit) costs a root journalctl.
They are capped per caller and in total, and each ends when the bus
connection that asked for it goes. A caller here is a real user's process
holding one connection and the pipes it got, without reading them."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

PER_CALLER = 8
TOTAL = 32
VENV_PY = "/opt/leviath-dev/venv/bin/python"
HOLDER = r"""
import asyncio, sys
from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus

async def main() -> None:
    bus = await MessageBus(bus_type=BusType.SYSTEM, negotiate_unix_fd=True).connect()
    ok, errors, kept = 0, [], []
    def logs():
        return bus.call(Message(
            destination="org.leviath.Manager1", path="/org/leviath/Manager1",
            interface="org.leviath.Manager1", member="Logs", signature="sb",
            body=[sys.argv[1], True]))
    n = int(sys.argv[2])
    if sys.argv[3] == "together":  # all at once, not waiting for replies
        replies = await asyncio.gather(*(logs() for _ in range(n)))
    else:
        replies = [await logs() for _ in range(n)]
    for r in replies:
        if r.message_type is MessageType.ERROR:
            errors.append(f"{r.error_name}: {r.body}")
        else:
            ok += 1
            kept += r.unix_fds
    print(f"ok {ok} refused {len(errors)} {sorted(set(errors))}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""


def followers(bed: Testbed) -> int:
    """journalctl processes the daemon runs."""
    pid = bed.run(["systemctl", "show", "-p", "MainPID", "--value", "leviathd"]).stdout.strip()
    r = bed.run(["pgrep", "-c", "-P", pid, "journalctl"], check=False)
    return int(r.stdout.strip() or 0)


class Holder:
    def __init__(
        self, bed: Testbed, user: str, agent_id: str, calls: int, how: str = "in-turn"
    ) -> None:
        self.proc = subprocess.Popen(
            bed.command([VENV_PY, "/tmp/holder.py", agent_id, str(calls), how], user=user),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.match(r"ok (\d+) refused (\d+) (.*)", line)
        assert m, line
        self.ok, self.refused, self.errors = int(m[1]), int(m[2]), m[3]

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def wait_for(check: object, timeout: float = 15) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.2)


@pytest.fixture(scope="module")
def agent(testbed: Testbed) -> Iterator[str]:
    bed = testbed
    bed.start_service("leviathd.service")
    bed.write_file("/tmp/holder.py", HOLDER)
    for name in ("lr1", "lr2", "lr3"):
        if name not in bed.users:
            bed.add_user(name, ("leviath", "leviath-admin"))
    work = f"{bed.users['alice'].home}/readersw"
    bed.run(["mkdir", "-p", work], user="alice")
    agent_id = bed.run(["lev", "run", "-d", "--", "sleep", "600"], user="alice",
                       cwd=work).stdout.strip()
    yield agent_id
    bed.run(["lev", "stop", agent_id], user="alice", check=False)


def test_followers_are_capped_per_caller_and_end_with_the_callers_connection(
    testbed: Testbed, agent: str
) -> None:
    bed = testbed
    before = followers(bed)
    holder = Holder(bed, "alice", agent, PER_CALLER + 4)
    try:
        assert holder.ok == PER_CALLER and holder.refused == 4, holder.errors
        assert "org.leviath.Error.LimitExceeded" in holder.errors
        assert followers(bed) == before + PER_CALLER
    finally:
        holder.close()
    # The connection is gone: so are its journalctl processes.
    wait_for(lambda: followers(bed) == before)
    # And the caller may open new ones.
    again = Holder(bed, "alice", agent, 1)
    again.close()
    assert again.ok == 1
    wait_for(lambda: followers(bed) == before)


def test_the_cap_holds_for_calls_sent_all_at_once(testbed: Testbed, agent: str) -> None:
    bed = testbed
    wait_for(lambda: followers(bed) == 0)  # a reader of an earlier test may still be ending
    before = 0
    holder = Holder(bed, "alice", agent, 3 * PER_CALLER, "together")
    try:
        assert holder.ok == PER_CALLER, (holder.ok, holder.errors)
        assert followers(bed) == before + PER_CALLER
    finally:
        holder.close()
    wait_for(lambda: followers(bed) == before)


def test_followers_are_capped_in_total(testbed: Testbed, agent: str) -> None:
    bed = testbed
    wait_for(lambda: followers(bed) == 0)
    holders: list[Holder] = []
    try:
        for user in ("alice", "dave", "lr1", "lr2"):
            holders.append(Holder(bed, user, agent, PER_CALLER))
            assert holders[-1].ok == PER_CALLER, (user, holders[-1].errors)
        late = Holder(bed, "lr3", agent, 1)
        holders.append(late)
        assert late.ok == 0 and "LimitExceeded" in late.errors
        assert followers(bed) == TOTAL
    finally:
        for h in holders:
            h.close()
    wait_for(lambda: followers(bed) == 0)
