"""Red team: a hostile agent hides a call it was allowed to make from the
audit trail (threats.md: the daemon's own limits, spoofed records).

The audit writer budgets each agent's records and, past the budget, counts
calls into a summary that names tool and outcome only. Refused calls cost the
agent nothing, so it sends a few hundred of them and then makes the call it
wants unseen: its target (here a file name; for http_get the URL it sent data
to) must still be in a record of its own."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from journal_wait import journal_with
from testbed import Testbed

pytestmark = pytest.mark.testbed

CONFIG = """
[sandbox]
kind = "namespace"

[tool_permissions]
web_fetch = "deny"
write_file = "allow"
"""

HIDE = r"""
import json, os, socket
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["LEVIATH_BROKER"])
junk = (json.dumps({"op": "call", "tool": "web_fetch",
                    "args": {"url": "http://localhost:1/"}}) + "\n").encode()
real = (json.dumps({"op": "call", "tool": "write_file",
                    "args": {"path": "EXFIL-MARKER.txt", "content": "x"}}) + "\n").encode()
s.sendall(junk * 300 + real)
f = s.makefile("rb")
replies = [json.loads(f.readline()) for _ in range(301)]
print("last", replies[-1]["ok"], flush=True)
"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    with testbed.machine_config(CONFIG):
        yield testbed


def test_refused_calls_do_not_push_an_allowed_call_out_of_the_record(bed: Testbed) -> None:
    w = f"{bed.users['alice'].home}/rtaudit"
    bed.run(f"mkdir -p {w} && rm -f {w}/out {w}/EXFIL-MARKER.txt", user="alice")
    bed.run(["sh", "-c", "cat > hide.py"], user="alice", cwd=w, input=HIDE)
    agent = bed.run(["lev", "run", "-d", "--", "sh", "-c", "python3 hide.py > out 2>&1"],
                    user="alice", cwd=w).stdout.strip()
    try:
        bed.run(["sh", "-c", f"until lev ps --all --json | grep -q '\"{agent}\"' && "
                 f"! lev ps --json | grep -q '\"{agent}\"'; do sleep 0.3; done"],
                user="alice", timeout=120)
        assert bed.read_file(f"{w}/out").strip() == "last True", bed.read_file(f"{w}/out")
        # The last summary is written within a second of the end; waited
        # for, with a bound, as journald may take its time.
        out = journal_with(bed, ["-o", "json", "_TRANSPORT=journal", "_UID=0",
                                 f"LEVIATH_AGENT={agent}"], "EXFIL-MARKER")
        records = [json.loads(x) for x in out.splitlines() if x.strip()]
        named = [r for r in records if r.get("LEVIATH_EVENT") == "tool"
                 and "EXFIL-MARKER" in r.get("LEVIATH_TARGET", "")]
        assert named, [r["MESSAGE"] for r in records if r.get("LEVIATH_EVENT") != "tool"]
    finally:
        bed.run(["lev", "stop", agent], user="alice", check=False)
