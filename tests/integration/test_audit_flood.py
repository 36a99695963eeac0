"""Issue 20 §6: one agent's flood of refused calls does not erase another
agent's audit records. Alice's agent sends 40,000 refused calls straight to
its broker socket as fast as it can; meanwhile bob's agent makes 10 calls and
ends. Bob's 10 records and his end record are all there; alice's individual
records and her summaries ("N refused calls to web_fetch") add up to 40,000."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator

import pytest
from testbed import Testbed

CALLS = 40_000
CONFIG = """
[sandbox]
kind = "namespace"

[tool_permissions]
web_fetch = "deny"
"""

FLOOD = r"""
import json, os, socket, sys, threading
n = int(sys.argv[1])
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["LEVIATH_BROKER"])
line = (json.dumps({"op": "call", "tool": "web_fetch",
                    "args": {"url": "http://localhost:1/"}}) + "\n").encode()

def send():
    for _ in range(n // 100):
        s.sendall(line * 100)

t = threading.Thread(target=send)
t.start()
f = s.makefile("rb")
refused = sum(1 for _ in range(n) if not json.loads(f.readline())["ok"])
t.join()
print(f"refused {refused}", flush=True)
"""


def trusted(bed: Testbed, agent_id: str, scope: str,
            until: Callable[[list[dict[str, str]]], bool] | None = None) -> list[dict[str, str]]:
    """The agent's records the daemon wrote; with `until`, once it holds of
    them (60 s at most: journald may be behind on a loaded machine)."""
    deadline = time.monotonic() + 60
    while True:
        out = bed.run(["journalctl", "--no-pager", "-o", "json", "_TRANSPORT=journal", "_UID=0",
                       f"LEVIATH_AGENT={agent_id}", "_SYSTEMD_UNIT=leviathd.service",
                       f"_SYSTEMD_UNIT={scope}"]).stdout
        records = [json.loads(x) for x in out.splitlines() if x.strip()]
        if until is None or until(records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    with testbed.machine_config(CONFIG):
        yield testbed


def test_a_flood_of_refused_calls_costs_no_other_agent_its_records(bed: Testbed) -> None:
    aw = f"{bed.users['alice'].home}/floodw"
    bw = f"{bed.users['bob'].home}/floodw"
    bed.run(f"mkdir -p {aw} && rm -f {aw}/go {aw}/out", user="alice")
    bed.run(["sh", "-c", "cat > flood.py"], user="alice", cwd=aw, input=FLOOD)
    bed.run(f"mkdir -p {bw} && rm -f {bw}/go && echo hi > {bw}/a.txt", user="bob")
    flooder = bed.run(
        ["lev", "run", "-d", "--", "sh", "-c",
         f"while [ ! -f go ]; do sleep 0.05; done; python3 flood.py {CALLS} > out 2>&1"],
        user="alice", cwd=aw).stdout.strip()
    quiet = bed.run(
        ["lev", "run", "-d", "--", "sh", "-c",
         "while [ ! -f go ]; do sleep 0.05; done; sleep 1; "
         "for i in 1 2 3 4 5 6 7 8 9 10; do lev tool read_file a.txt >/dev/null; done"],
        user="bob", cwd=bw).stdout.strip()
    try:
        bed.run(["touch", f"{aw}/go"], user="alice")
        bed.run(["touch", f"{bw}/go"], user="bob")
        t0 = time.monotonic()
        for agent_id, user in ((quiet, "bob"), (flooder, "alice")):
            bed.run(["sh", "-c", f"until lev ps --all --json | grep -q '\"{agent_id}\"' && "
                     f"! lev ps --json | grep -q '\"{agent_id}\"'; do sleep 0.5; done"],
                    user=user, timeout=600)
        elapsed = time.monotonic() - t0
        out = bed.read_file(f"{aw}/out")
        assert out.strip() == f"refused {CALLS}", out
        # Bob's agent: every decision and its end (waited for, with a bound).
        records = trusted(bed, quiet, f"leviath-bob-sh-{quiet}.scope", lambda rs: any(
            r.get("LEVIATH_EVENT") == "end" for r in rs) and sum(
            r.get("LEVIATH_EVENT") == "tool" for r in rs) >= 10)
        tools = [r for r in records if r.get("LEVIATH_EVENT") == "tool"]
        assert len(tools) == 10, [r["MESSAGE"] for r in records]
        assert all(r["LEVIATH_OUTCOME"] == "allow" for r in tools)
        assert any(r.get("LEVIATH_EVENT") == "end" for r in records)
        shown = bed.run(["lev", "audit", quiet], user="bob").stdout
        assert shown.count(" read_file ") == 10 and "[end]" in shown, shown

        # Alice's agent: accounted for, mostly in summaries, and its end kept.
        # The last summary is written within a second of the end: waited for.
        records = trusted(bed, flooder, f"leviath-alice-sh-{flooder}.scope", lambda rs: sum(
            r.get("LEVIATH_EVENT") == "tool" for r in rs) + sum(
            int(r["LEVIATH_COUNT"]) for r in rs
            if r.get("LEVIATH_EVENT") == "tool-summary") >= CALLS)
        single = sum(1 for r in records if r.get("LEVIATH_EVENT") == "tool")
        summaries = [r for r in records if r.get("LEVIATH_EVENT") == "tool-summary"]
        counted = sum(int(r["LEVIATH_COUNT"]) for r in summaries)
        assert single + counted == CALLS, (single, counted)
        assert single <= 100 + 20 * (elapsed + 2), single
        assert re.search(r"[\d,]+ refused calls to web_fetch in the last \d+ s",
                         summaries[0]["MESSAGE"]), summaries[0]["MESSAGE"]
        assert any(r.get("LEVIATH_EVENT") == "end" for r in records)
        print(f"flood: {CALLS} calls in {elapsed:.1f} s; {single} records one by one, "
              f"{counted} in {len(summaries)} summaries")
    finally:
        for agent_id, user in ((flooder, "alice"), (quiet, "bob")):
            bed.run(["lev", "stop", agent_id], user=user, check=False)
