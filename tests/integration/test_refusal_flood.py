"""A refused user cannot flood the daemon's journal with its refusals.

carol (in no group: polkit refuses her) sends 2,000 calls she is refused,
half `Reload` (polkit says no) and half `Get` with a malformed id (refused
before anyone is asked), 16 at a time on one connection. Every call still
gets its named error; the daemon's journal holds at most a bounded number of
"... refused" lines for them, one summary line per interval states how many
more there were (the full lines and the summaries add up to 2,000), and an
unrelated record written after the flood (alice's agent starting and ending)
is there. Seen failing before the throttle: 2,000 refused lines, no summary."""

from __future__ import annotations

import json
import re
import time

from testbed import Testbed

from leviathd.bus import calllog

CALLS = 2000
VENV_PY = "/opt/leviath-dev/venv/bin/python"

FLOOD = r"""
import asyncio, json, sys
from dbus_fast import BusType, Message
from dbus_fast.aio import MessageBus

async def main(n):
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    gate = asyncio.Semaphore(16)
    names = {}

    async def one(i):
        if i % 2:
            msg = Message(destination="org.leviath.Manager1", path="/org/leviath/Manager1",
                          interface="org.leviath.Manager1", member="Reload")
        else:
            msg = Message(destination="org.leviath.Manager1", path="/org/leviath/Manager1",
                          interface="org.leviath.Manager1", member="Get", signature="s",
                          body=["not-an-id"])
        async with gate:
            reply = await bus.call(msg)
        key = reply.error_name or "ok"
        names[key] = names.get(key, 0) + 1

    await asyncio.gather(*(one(i) for i in range(n)))
    print(json.dumps(names), flush=True)

asyncio.run(main(int(sys.argv[1])))
"""

REFUSED_LINE = re.compile(r"leviathd\.bus\.errors: (Reload|Get) refused")


def daemon_lines(bed: Testbed, since: str) -> list[dict[str, str]]:
    out = bed.run(["journalctl", "--no-pager", "-q", "-o", "json", "-u", "leviathd",
                   "--since", since]).stdout
    return [json.loads(x) for x in out.splitlines() if x.strip()]


def test_a_refused_users_flood_leaves_a_bounded_count_and_a_summary(testbed: Testbed) -> None:
    bed = testbed
    bed.start_service("leviathd.service")
    carol = bed.users["carol"].uid
    bed.write_file("/tmp/refusal_flood.py", FLOOD)
    since = bed.run(["date", "+@%s.%N"]).stdout.strip()
    t0 = time.monotonic()
    out = bed.run([VENV_PY, "/tmp/refusal_flood.py", str(CALLS)], user="carol",
                  timeout=600).stdout
    elapsed = time.monotonic() - t0
    # The refusals themselves are unchanged: every call gets its named error.
    assert json.loads(out) == {"org.leviath.Error.AccessDenied": CALLS // 2,
                               "org.leviath.Error.InvalidArgument": CALLS // 2}, out

    # Held lines are summed up once the interval is over.
    summary = re.compile(rf"uid {carol}: ([\d,]+) more lines on refused calls not logged")
    deadline = time.monotonic() + calllog.WINDOW + 20
    while True:
        lines = daemon_lines(bed, since)
        full = [e["MESSAGE"] for e in lines if REFUSED_LINE.search(e.get("MESSAGE", ""))]
        summaries = [e["MESSAGE"] for e in lines if summary.search(e.get("MESSAGE", ""))]
        counted = sum(int(summary.search(s).group(1).replace(",", ""))  # type: ignore[union-attr]
                      for s in summaries)
        if len(full) + counted >= CALLS or time.monotonic() > deadline:
            break
        time.sleep(1)
    print(f"flood: {CALLS} refused calls in {elapsed:.1f} s; {len(full)} lines one by one, "
          f"{counted} in {len(summaries)} summaries")
    intervals = elapsed / calllog.WINDOW + 2
    assert len(full) <= calllog.PER_UID * intervals, (len(full), full[:3])
    assert summaries, full[-3:]
    assert len(summaries) <= intervals, summaries
    assert len(full) + counted == CALLS, (len(full), counted, summaries)
    assert all(f"uid {carol}" in line for line in full), full[:3]

    # An unrelated record written afterwards is kept.
    home = bed.users["alice"].home
    bed.run(["mkdir", "-p", f"{home}/work"], user="alice")
    agent = bed.run(["lev", "run", "-d", "--", "true"], user="alice",
                    cwd=f"{home}/work").stdout.strip()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ended = bed.run(["journalctl", "--no-pager", "-q", "-o", "cat", "_UID=0",
                         f"LEVIATH_AGENT={agent}", "LEVIATH_EVENT=end"]).stdout
        if ended.strip():
            break
        time.sleep(0.5)
    started = bed.run(["journalctl", "--no-pager", "-q", "-o", "cat", "_UID=0",
                       f"LEVIATH_AGENT={agent}", "LEVIATH_EVENT=start"]).stdout
    assert f"agent {agent}" in started and "started for alice" in started, started
    assert f"agent {agent}" in ended, ended


LEAVING = r"""
import asyncio, sys
from dbus_fast import BusType, Message
from dbus_fast.aio import MessageBus

async def main(n):
    for _ in range(n):
        bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
        await bus.send(Message(destination="org.leviath.Manager1", path="/org/leviath/Manager1",
                               interface="org.leviath.Manager1", member="Reload"))
        bus.disconnect()
        await bus.wait_for_disconnect()
    print("sent", n, flush=True)

asyncio.run(main(int(sys.argv[1])))
"""
LEAVERS = 400
OURS = re.compile(r"leviathd\.bus\.\w+: ")


def test_calls_from_connections_that_leave_at_once_stay_bounded_too(testbed: Testbed) -> None:
    """carol sends each refused call on a new connection and leaves without
    waiting for the answer, so that the daemon may not learn who she was,
    and polkit, asked about a name that has gone, answers with an error
    (a warning line each). All lines about them stay within two budgets
    (hers, and the one for callers the bus could not name), with summaries.
    Seen failing before the throttle: one line or more per call."""
    bed = testbed
    bed.start_service("leviathd.service")
    bed.write_file("/tmp/refusal_leaving.py", LEAVING)
    since = bed.run(["date", "+@%s.%N"]).stdout.strip()
    t0 = time.monotonic()
    out = bed.run([VENV_PY, "/tmp/refusal_leaving.py", str(LEAVERS)], user="carol",
                  timeout=600).stdout
    elapsed = time.monotonic() - t0
    assert out.strip() == f"sent {LEAVERS}", out
    time.sleep(calllog.WINDOW + 2)
    lines = [e.get("MESSAGE", "") for e in daemon_lines(bed, since)]
    ours = [m for m in lines if isinstance(m, str) and OURS.search(m)]
    summaries = [m for m in ours if "more lines on refused calls not logged" in m]
    single = len(ours) - len(summaries)
    print(f"leaving: {LEAVERS} calls in {elapsed:.1f} s; {single} lines one by one, "
          f"{len(summaries)} summaries: {summaries[:2]}")
    intervals = elapsed / calllog.WINDOW + 2
    assert single <= 2 * calllog.PER_UID * intervals, (single, ours[:5])
    assert summaries, ours[-5:]
