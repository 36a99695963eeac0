"""An agent chooses the target of a held call; when the hold ends (here by
timing out) the daemon writes one journal record about it. That record is a
line an agent wrote into the system journal: its target must arrive bounded
(journal.record's 8 KiB a field) and escaped, not as the agent's 60,000
characters with its own newlines and terminal sequences. Red team, this round:
it held (no fix needed); kept as the attacker's check."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

CONFIG = """
[sandbox]
kind = "namespace"

[tool_permissions]
list_dir = "ask"

[taint]
approval_timeout = 1
"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    with testbed.machine_config(CONFIG):
        testbed.run(["mkdir", "-p", f"{testbed.users['alice'].home}/apj"], user="alice")
        yield testbed


def test_an_agents_target_reaches_the_approval_journal_record_bounded_and_escaped(
    bed: Testbed,
) -> None:
    w = f"{bed.users['alice'].home}/apj"
    # 60,000 characters, a newline that would forge a second line, and ESC.
    script = ("t=$(printf 'docs\\nFORGED leviathd: approval granted\\033[2J'; "
              "head -c 60000 /dev/zero | tr '\\0' a); lev tool list_dir \"$t\"; echo CALL-DONE")
    r = bed.run(["lev", "run", "--", "sh", "-c", script], user="alice", cwd=w, check=False,
                timeout=90)
    assert "CALL-DONE" in r.stdout + r.stderr, r.stdout + r.stderr
    deadline = time.monotonic() + 20
    records: list[dict[str, object]] = []
    while not records:
        assert time.monotonic() < deadline, "no approval record in the journal"
        out = bed.run(["journalctl", "--no-pager", "-q", "--all", "-o", "json", "-u", "leviathd",
                       "LEVIATH_EVENT=approval"], check=False).stdout
        records = [json.loads(line) for line in out.splitlines() if line.strip()]
        time.sleep(0.3)
    for rec in records:
        for field in ("MESSAGE", "LEVIATH_TARGET"):
            value = rec.get(field)
            # journalctl gives a field with control characters as a byte list.
            assert isinstance(value, str), (field, str(value)[:300])
            assert len(value) <= 8192, (field, len(value))  # journal.record's FIELD_MAX
            assert "\n" not in value and "\x1b" not in value, (field, value[:300])
