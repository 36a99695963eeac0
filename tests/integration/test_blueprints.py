"""Blueprints through the daemon: seed commands, then stages in order, each in
the sandbox its effective settings give; `lev add`, `lev run NAME`, and
`lev inspect ID` showing what each step sees."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from journal_wait import journal_with
from testbed import Testbed

BLUEPRINT = """
[agent]
name = "builder"
version = "1.2.0"
description = "seed, then two stages"

[seed]
commands = [["sh", "-c", "echo seeded > seed.txt"]]

[stages.fetch]
command = ["sh", "-c", "cat seed.txt; ls /sys/class/net 2>/dev/null | tr '\\\\n' ' '; echo"]

[stages.check]
command = ["sh", "-c", "test -f seed.txt && echo check-ran && exit 4"]

[stages.check.sandbox]
network = false

[stages.never]
command = ["sh", "-c", "echo must-not-run"]
"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "restart", "leviathd"])
    home = testbed.users["alice"].home
    testbed.run(["mkdir", "-p", f"{home}/bp/builder", f"{home}/proj"], user="alice")
    testbed.run(f"cat > {home}/bp/builder/blueprint.toml", user="alice", input=BLUEPRINT)
    yield testbed


def test_seed_then_stages_run_in_order_and_a_failing_stage_ends_the_agent(bed: Testbed) -> None:
    home = bed.users["alice"].home
    bed.run(["lev", "add", f"{home}/bp/builder"], user="alice")
    r = bed.run(["lev", "run", "builder"], user="alice", cwd=f"{home}/proj", check=False)
    assert r.returncode == 4, r
    lines = r.stdout.splitlines()
    assert lines[0] == "seeded"
    assert "check-ran" in r.stdout and "must-not-run" not in r.stdout
    rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="alice").stdout)
    row = [x for x in rows if x["agent"] == "builder"][-1]
    assert row["state"] == "exited" and row["exit_status"] == 4
    steps = journal_with(bed, ["-o", "cat", f"LEVIATH_AGENT={row['id']}",
                               "LEVIATH_EVENT=step-start"], "stage check starts")
    assert [line.split(": ", 1)[1] for line in steps.splitlines()] == [
        "seed 1 starts", "stage fetch starts", "stage check starts",
    ]


def test_inspect_by_id_shows_each_steps_sandbox(bed: Testbed) -> None:
    rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="alice").stdout)
    agent_id = [x for x in rows if x["agent"] == "builder"][-1]["id"]
    steps = json.loads(bed.run(["lev", "inspect", agent_id, "--json"], user="alice").stdout)
    labels = [s["label"] for s in steps]
    assert labels == ["seed 1", "stage fetch", "stage check", "stage never"]
    by_label = {s["label"]: s["spec"] for s in steps}
    # No network set: the built-in default, the proxy (issue 30).
    assert by_label["stage fetch"]["network"] is False and by_label["stage fetch"]["proxy"]
    assert by_label["stage check"]["network"] is False and not by_label["stage check"]["proxy"]
    text = bed.run(["lev", "inspect", agent_id], user="alice").stdout
    assert "== stage check ==" in text and "none (only lo)" in text
    r = bed.run(["lev", "inspect", agent_id], user="bob", check=False)
    assert r.returncode != 0 and "no agent with id" in r.stderr
