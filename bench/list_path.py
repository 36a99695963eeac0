"""The daemon's own cost of one `List` reply at N running agents (issue 18),
in-process, without the bus round trip, polkit or a client's printing (which
bench/scale.py's busctl figures include): Agents.list over N records in
memory, then the rows as D-Bus Variants and the reply marshalled, as
bus/manager_iface.py does. Median of --rounds after one warm-up call.

    /opt/leviath-dev/venv/bin/python bench/list_path.py [--counts 50,150,500]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dbus_fast import Message, MessageType

from leviathd.agents.service import Agents
from leviathd.agents.usage import UsageCache
from leviathd.authority import Caller, Right
from leviathd.bus.manager_iface import record_to_variants
from leviathd.records import AgentRecord


class _Admin:
    """Says yes: an admin's List, the one that sees every agent."""

    async def allowed(self, who: Caller, right: Right) -> bool:
        return True


class _NoEnded:
    def __init__(self) -> None:
        self.ended: dict[str, object] = {}


def _agents(n: int) -> Agents:
    agents = Agents.__new__(Agents)
    agents._authority = _Admin()  # type: ignore[assignment]
    agents._store = _NoEnded()  # type: ignore[assignment]
    agents.unsaved = {}
    now = time.time()
    agents.records = {
        f"{i:08x}": AgentRecord(
            id=f"{i:08x}", uid=1001 + i % 3, user=("alice", "bob", "dave")[i % 3],
            agent="sleep", command=["sleep", "600"], workdir="/home/alice/work",
            unit=f"leviath-alice-sleep-{i:08x}.scope", sandbox="namespace",
            supervisor_pid=10000 + i, scratch=f"/var/lib/leviath/scratch/{i:08x}",
            started_at=now + i,
        ) for i in range(n)
    }  # fmt: skip

    async def never(_a: str, _u: str) -> tuple[dict[str, int | None], str]:
        return {}, ""

    agents.usage = UsageCache(never)
    for agent_id in agents.records:
        agents.usage._rows[agent_id] = {"memory": 1 << 20, "tasks": 2, "tasks_max": 256}
    agents.usage._refreshed = time.monotonic() + 1e9  # no background refresh here
    return agents


async def _one_list(agents: Agents) -> tuple[float, int]:
    t0 = time.perf_counter()
    rows, _cursor = await agents.list(Caller(":1.1", 0, None), include_ended=False)
    body = [record_to_variants(rec, live) for rec, live in rows]
    msg = Message(message_type=MessageType.METHOD_RETURN, reply_serial=1, destination=":1.1",
                  signature="aa{sv}", body=[body])
    msg._marshall(False)
    return (time.perf_counter() - t0) * 1e3, len(rows)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="50,150,500")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    print("| agents | rows in the reply | daemon's List path, median | p90 |")
    print("| --- | --- | --- | --- |")
    for n in (int(c) for c in args.counts.split(",")):
        agents = _agents(n)
        await _one_list(agents)
        samples = []
        rows = 0
        for _ in range(args.rounds):
            ms, rows = await _one_list(agents)
            samples.append(ms)
        samples.sort()
        print(f"| {n} | {rows} | {statistics.median(samples):.2f} ms | "
              f"{samples[int(len(samples) * 0.9)]:.2f} ms |", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
