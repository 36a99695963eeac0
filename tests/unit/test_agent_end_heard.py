"""An agent's end is heard even where the event loop would not deliver it.

CI4 (2026-12-02) left one attached agent "running" for ever: the pidfd
watching its PID 1 had a number a closed proxy listener still held in the
loop's map, so it was never put in epoll (tests/unit/test_proxy_close.py).
Two defences are tested here from that failure's side, each with the other
out of the way: a descriptor just opened is registered past any stale
entry under its number (loopfd.py), and the daemon's maintenance asks the
watched pidfds itself, so an end the loop lost is still taken."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest
from test_agents_service import StandInAuthority, StandInSystemd, alices_agent, make_agents

from leviathd.agents import ending
from leviathd.agents.service import Agents
from leviathd.records import AgentRecord


@pytest.fixture(autouse=True)
def _in_scope(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stand-in agent's process sits in no scope of ours; the scope check
    # (ending._supervisor_alive) is what a real start satisfies.
    monkeypatch.setattr(ending, "_supervisor_alive", lambda _rec: True)


def _running(tmp_path: Path, proc: subprocess.Popen[bytes]) -> tuple[Agents, AgentRecord]:
    agents = make_agents(tmp_path, StandInAuthority({}), StandInSystemd())
    rec = alices_agent()
    rec.supervisor_pid = proc.pid
    agents.records[rec.id] = rec
    return agents, rec


async def _ended(agents: Agents, agent_id: str, seconds: float = 10.0) -> bool:
    for _ in range(int(seconds / 0.02)):
        if agent_id not in agents.records:
            return True
        await asyncio.sleep(0.02)
    return False


def test_a_pidfd_under_a_stale_loop_number_still_hears_the_end(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "60"])

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        agents, rec = _running(tmp_path, proc)
        # What the proxy's close did: a number closed while the loop still
        # had it registered.
        stale = os.eventfd(0)
        loop.add_reader(stale, lambda: None)
        os.close(stale)
        agents._watch(rec)
        assert agents._watches[rec.id] == stale, "the pidfd did not get the stale number"
        proc.kill()
        proc.wait()
        return await _ended(agents, rec.id)

    try:
        assert asyncio.run(main())
    finally:
        proc.kill()
        proc.wait()


def test_an_end_the_loop_lost_is_taken_by_maintenance(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "60"])

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        agents, rec = _running(tmp_path, proc)
        agents._watch(rec)
        loop.remove_reader(agents._watches[rec.id])  # the loop will not tell
        proc.kill()
        proc.wait()
        upkeep = asyncio.create_task(agents.maintain(every=0.05))
        try:
            return await _ended(agents, rec.id)
        finally:
            upkeep.cancel()

    try:
        assert asyncio.run(main())
    finally:
        proc.kill()
        proc.wait()


def test_an_end_the_loop_is_about_to_deliver_is_left_to_the_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The recheck may run in the moment between PID 1's exit and the loop's
    next look at epoll: that end is not lost, and taking it there said
    "not heard" for nothing (a bed run's journal, 2026-12-03)."""
    proc = subprocess.Popen(["sleep", "60"])

    async def main() -> tuple[bool, bool]:
        agents, rec = _running(tmp_path, proc)
        agents._watch(rec)
        proc.kill()
        proc.wait()  # the pidfd is readable; the loop has not turned since
        agents._unheard_ends()
        taken = rec.id not in agents._watches
        return taken, await _ended(agents, rec.id)

    try:
        with caplog.at_level("ERROR"):
            taken, ended = asyncio.run(main())
        assert ended
        assert not taken, "the recheck took an end the loop was about to deliver"
        assert "not heard" not in caplog.text
    finally:
        proc.kill()
        proc.wait()
