"""Labels that outlive the run (issue 12): a file an agent's own process
wrote while it held Private data stays Private for the NEXT agent started on
the same workdir, including one started the lean way (detached, one step,
no supervisor left: namespace.start), whose processes read it behind the
broker's back."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from loop_agent import lay_out, start_detached
from test_gate_bed import Agent, lev
from testbed import Testbed

pytestmark = pytest.mark.testbed

BLUEPRINT = """
[agent]
name = "runstest"
description = "runs the test's commands"
command = ["sh", "loop.sh"]

[read_paths]
allow = ["~/shared"]
"""

CONFIG = """
[sandbox]
kind = "namespace"

[agent_read_paths.runstest]
allow = ["~/shared"]

[taint]
enabled = true
on_exceed = "deny"
budget = 4
"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    lay_out(testbed, "tw", "tbp", BLUEPRINT, {"shared/doc.txt": "granted text\n"})
    with testbed.machine_config(CONFIG):
        yield testbed


def start(bed: Testbed) -> Agent:
    return Agent(bed, "alice", start_detached(bed, "tbp", "tw"), f"{bed.users['alice'].home}/tw")


def private_ids(agent: Agent) -> list[str]:
    rc, out, err = agent.call("lev tool --ledger")
    assert rc == 0, err
    return [str(e["id"]) for e in json.loads(out)["entries"] if e["label"] == "private"]


def test_the_next_agents_own_process_reading_a_labelled_file_is_private_again(
    bed: Testbed,
) -> None:
    home = bed.users["alice"].home
    first = start(bed)
    try:
        rc, _out, err = first.call(f"lev tool read_file {home}/shared/doc.txt > carried.json")
        assert rc == 0, err
    finally:
        lev(bed, "alice", "stop", first.id, check=False)
    second = start(bed)
    try:
        assert second.taint() != "private"
        rc, _out, err = second.call("cat carried.json >/dev/null && cp carried.json copy.json")
        assert rc == 0, err
        assert second.taint() == "private"
        ids = private_ids(second)
        assert second.call(f"lev tool --evict {' '.join(ids)}")[0] == 0
        assert second.taint() != "private"
        rc, _out, err = second.call("lev tool read_file copy.json")
        assert rc == 0, err
        assert second.taint() == "private"
    finally:
        lev(bed, "alice", "stop", second.id, check=False)
