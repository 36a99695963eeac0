"""Issue 33, item 2, from inside real agents in the test bed: the `shell`
tool (and blueprint tools, which run the same way) sees the agent's own
home, /tmp and throwaway layer, the same files at the same paths, for as
long as the agent runs. Before, each call built a fresh fence with a fresh,
empty scratch, and under throwaway read the host's tree (seen failing: the
commit message says how)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from testbed import Testbed

pytestmark = pytest.mark.testbed

CONFIG = """
[sandbox]
kind = "namespace"

[tool_permissions]
shell = "allow"
"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.run("mkdir -p sw && printf 'host version\\n' > sw/f.txt", user="alice")
    yield testbed
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "restart", "leviathd"])


def agent(bed: Testbed, script: str, *flags: str) -> str:
    """Run `script` as an agent (attached) in ~/sw; its stdout."""
    home = bed.users["alice"].home
    r = bed.run(["lev", "run", *flags, "--", "sh", "-c", script], user="alice",
                cwd=f"{home}/sw", check=False, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def shell_results(out: str) -> list[dict]:
    """The JSON lines `lev tool shell` printed, in order."""
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_shell_calls_share_tmp_and_home_with_each_other_and_the_agent(bed: Testbed) -> None:
    out = agent(bed, """
        lev tool shell 'echo a > /tmp/a; echo h > ~/h; echo written' | tr -d '\\n'; echo
        lev tool shell 'cat /tmp/a ~/h' | tr -d '\\n'; echo
        echo "agent: $(cat /tmp/a ~/h | tr '\\n' ' ')"
    """)
    first, second = shell_results(out)
    assert first["exit_status"] == 0 and "written" in first["stdout"], first
    assert second["exit_status"] == 0, second
    assert second["stdout"] == "a\nh\n", second
    assert "agent: a h " in out, out


def test_the_agents_file_in_tmp_is_visible_to_its_shell_tool(bed: Testbed) -> None:
    """Also (issue 50): the shell tool runs in the agent's network namespace,
    not the daemon's: what it reaches is what the agent reaches (seen
    failing with CLONE_NEWNET left out of the namespaces joined)."""
    out = agent(bed, """
        echo from-agent > /tmp/mine; echo home-too > ~/mine
        echo "agent-net: $(readlink /proc/self/ns/net)"
        lev tool shell 'cat /tmp/mine ~/mine; id -u; pwd; readlink /proc/self/ns/net' \\
          | tr -d '\\n'; echo
    """)
    (got,) = shell_results(out)
    assert got["exit_status"] == 0, got
    lines = got["stdout"].splitlines()
    assert lines[:2] == ["from-agent", "home-too"], got
    assert lines[2] == str(bed.users["alice"].uid)
    assert lines[3] == f"{bed.users['alice'].home}/sw"
    (agent_net,) = [x.split(": ", 1)[1] for x in out.splitlines()
                    if x.startswith("agent-net: ")]
    daemon = bed.run(["systemctl", "show", "-P", "MainPID", "leviathd"]).stdout.strip()
    daemon_net = bed.run(["readlink", f"/proc/{daemon}/ns/net"]).stdout.strip()
    assert agent_net.startswith("net:[") and agent_net != daemon_net, (agent_net, daemon_net)
    assert lines[4] == agent_net, (lines, agent_net)


def test_under_throwaway_the_shell_tool_sees_the_agents_edits_not_the_host_tree(
    bed: Testbed,
) -> None:
    out = agent(bed, """
        printf 'agent edit\\n' > f.txt; printf 'new\\n' > added.txt
        lev tool shell 'cat f.txt added.txt; printf "shell edit\\n" > by-shell.txt' \\
            | tr -d '\\n'; echo
        echo "agent sees: $(cat by-shell.txt)"
    """, "--workdir-mode", "throwaway")
    (got,) = shell_results(out)
    assert got["exit_status"] == 0, got
    assert got["stdout"] == "agent edit\nnew\n", got
    assert "agent sees: shell edit" in out, out
    # The host's tree is untouched by either.
    home = bed.users["alice"].home
    assert bed.read_file(f"{home}/sw/f.txt") == "host version\n"
    assert bed.run(["ls", f"{home}/sw"]).stdout.split() == ["f.txt"]


STAGED = """
[agent]
name = "staged"
description = "a seed and two stages sharing one scratch"

[seed]
commands = [["sh", "-c", "echo from-seed > /tmp/s; echo seed-home > ~/s; echo seed-edit > f.txt"]]

[stages.one]
command = ["sh", "-c", '''echo from-one >> /tmp/s
lev tool shell 'cat /tmp/s ~/s f.txt' | tr -d '\\n'; echo''']

[stages.two]
command = ["sh", "-c", "echo two: $(cat /tmp/s ~/s f.txt | tr '\\\\n' ' ')"]
"""


def test_every_step_and_its_shell_tool_share_one_scratch_and_layer(bed: Testbed) -> None:
    # A supervised agent (seed and stages): the shell tool joins the fence
    # of the step running now, a child of the supervisor.
    home = bed.users["alice"].home
    bed.run(f"mkdir -p {home}/bp/staged && cat > {home}/bp/staged/blueprint.toml", user="alice",
            input=STAGED)  # fmt: skip
    r = bed.run(["lev", "run", "--workdir-mode", "throwaway", f"{home}/bp/staged"], user="alice",
                cwd=f"{home}/sw", check=False, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    (got,) = shell_results(r.stdout)
    assert got["exit_status"] == 0, got
    assert got["stdout"] == "from-seed\nfrom-one\nseed-home\nseed-edit\n", got
    assert "two: from-seed from-one seed-home seed-edit\n" in r.stdout, r.stdout
    assert bed.read_file(f"{home}/sw/f.txt") == "host version\n"
