"""Red team, issue 12 (taint survives the workdir): ways an agent tries to
write Private data somewhere the fanotify labels miss, evict, and read it
back unlabelled. Each is the attacker's side, from inside a real agent
(namespace fence, no network, so its `shell` tool can send nothing and runs
while Private: the broker's http_post is the way out once the taint drops).

The agent loop and helpers are test_gate_bed.py's."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from loop_agent import LOOP, lay_out, start_detached
from test_gate_bed import Agent, lev
from testbed import Testbed

pytestmark = pytest.mark.testbed

BLUEPRINT = """
[agent]
name = "washer"
description = "launders"
command = ["sh", "loop.sh"]

[read_paths]
allow = ["~/shared"]

[tools.note]
description = "writes a note in the workdir"
argv = ["sh", "-c", "printf '%s' \\"$1\\" > note.txt", "note", "{text}"]

[tools.note.arguments]
required = ["text"]

[tools.note.arguments.properties.text]
type = "string"
maxLength = 200
"""

CONFIG = """
[sandbox]
kind = "namespace"
network = false

[agent_read_paths.washer]
allow = ["~/shared"]

[taint]
enabled = true
on_exceed = "deny"
budget = 16
"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    lay_out(testbed, "ww", "wbp", BLUEPRINT, {"shared/doc.txt": "granted text\n"})
    with testbed.machine_config(CONFIG):
        yield testbed


@pytest.fixture(scope="module")
def agent(bed: Testbed) -> Iterator[Agent]:
    a = Agent(bed, "alice", start_detached(bed, "wbp", "ww"), f"{bed.users['alice'].home}/ww")
    yield a
    lev(bed, "alice", "stop", a.id, check=False)


def _evict(agent: Agent) -> None:
    rc, out, err = agent.call("lev tool --ledger")
    assert rc == 0, err
    ids = [str(e["id"]) for e in json.loads(out)["entries"] if e["label"] == "private"]
    if ids:
        rc, _out, err = agent.call(f"lev tool --evict {' '.join(ids)}")
        assert rc == 0, err
    assert agent.taint() != "private"


def _read_back(agent: Agent, path: str) -> str:
    rc, _out, err = agent.call(f"lev tool read_file {path}")
    assert rc == 0, err
    taint = agent.taint()
    _evict(agent)
    return taint


def test_a_file_the_shell_tool_writes_while_private_keeps_the_label(
    bed: Testbed, agent: Agent
) -> None:
    """The `shell` tool builds a fresh fence (a mount namespace of its own,
    new mounts) per command; with no network it runs while Private. What it
    writes in the workdir must be labelled like the agent's own writes."""
    home = bed.users["alice"].home
    _evict(agent)
    rc, _out, err = agent.call(
        f"lev tool read_file {home}/shared/doc.txt > held.json && "
        "lev tool shell 'cp held.json viashell.json; echo kept > viashell2.txt'")
    assert rc == 0, err
    assert agent.taint() == "private"
    # The agent's own copy is labelled (its fence is watched)...
    _evict(agent)
    assert _read_back(agent, "held.json") == "private"
    # ...and the one the shell tool's fence wrote must be too.
    assert _read_back(agent, "viashell.json") == "private"
    assert _read_back(agent, "viashell2.txt") == "private"


def test_a_file_a_blueprint_tool_writes_while_private_keeps_the_label(
    bed: Testbed, agent: Agent
) -> None:
    """A blueprint tool runs in a fresh fence too, while Private when its
    fence has no network: the data it is handed and writes is labelled."""
    home = bed.users["alice"].home
    _evict(agent)
    rc, _out, err = agent.call(
        f"lev tool read_file {home}/shared/doc.txt >/dev/null && lev tool note granted")
    assert rc == 0, err
    assert agent.taint() == "private"
    _evict(agent)
    assert _read_back(agent, "note.txt") == "private"


def test_a_write_through_a_mount_past_the_first_256_is_not_laundered(bed: Testbed) -> None:
    """The agent's workdir names 64 submodules (its own .gitmodules, from an
    earlier run): the next agent there gets six mounts for each git folder
    (the pin and the protected files), more than the watch read of its
    mount table. A write through a late one (a submodule's pinned .git)
    must not come back unlabelled after the eviction."""
    home = bed.users["alice"].home
    wd = f"{home}/ww2"
    bed.run(f"""
        set -e
        rm -rf {wd} && mkdir -p {wd}/.req
        cd {wd}
        for i in $(seq 0 63); do
            mkdir -p s$i/.git && echo 'ref: refs/heads/main' > s$i/.git/HEAD
            printf '[submodule "s%s"]\\n\\tpath = s%s\\n' $i $i >> .gitmodules
        done
    """, user="alice")
    bed.run(["sh", "-c", "cat > loop.sh"], user="alice", cwd=wd, input=LOOP)
    out = lev(bed, "alice", "run", "--detach", f"{home}/wbp", cwd=wd).stdout.strip()
    a = Agent(bed, "alice", out, wd)
    try:
        rc, mounts, err = a.call("wc -l < /proc/self/mountinfo")
        assert rc == 0 and int(mounts) > 256, (mounts, err)
        rc, _out, err = a.call(
            f"lev tool read_file {home}/shared/doc.txt > s63/.git/late.json")
        assert rc == 0, err
        assert a.taint() == "private"
        _evict(a)
        assert _read_back(a, "s63/.git/late.json") == "private"
    finally:
        lev(bed, "alice", "stop", a.id, check=False)


FLOOD = """
import os
os.makedirs("flood", exist_ok=True)
for i in range(20000):
    fd = os.open(f"flood/f{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"x")
    os.close(fd)
"""


def test_a_labelled_file_opened_behind_a_flood_of_events_still_raises_the_taint_first(
    bed: Testbed, agent: Agent
) -> None:
    """The agent opens its labelled file after the eviction, behind tens of
    thousands of its own file events, and asks the broker to send at once:
    the broker must have seen the open before it reads the taint."""
    home = bed.users["alice"].home
    _evict(agent)
    rc, _out, err = agent.call(f"lev tool read_file {home}/shared/doc.txt > flooded.json")
    assert rc == 0, err
    _evict(agent)
    rc, out, err = agent.call(
        f"rm -rf flood; python3 - <<'EOF'\n{FLOOD}EOF\n"
        "cat flooded.json >/dev/null; lev tool http_get http://127.0.0.1:9/x")
    agent.call("rm -rf flood")
    try:
        assert "on_exceed=deny" in out + err, out + err
    finally:
        _evict(agent)
