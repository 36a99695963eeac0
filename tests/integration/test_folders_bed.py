"""Folders per agent and per repository (issue 33 item 4), from inside real
agents: a folder given to agent `a` for repository ~/r is visible read-only
to `a` in ~/r, not to `a` elsewhere nor to agent `b` there; a write grant is
writable; a grant inside ~/.ssh refuses the start."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from testbed import Testbed

USER = "fola"
PROBE = ("for f in ~/specs/f ~/out/f; do cat $f 2>&1 || echo absent:$f; done; "
         "(echo w > ~/specs/w) 2>&1 || true; (echo w > ~/out/w && echo out-written) 2>&1 || true")
CONFIG = """
[[folders]]
path = "~/specs"
agent = "a"
repository = "~/r"

[[folders]]
path = "~/out"
access = "write"
agent = "a"
repository = "~/r"
"""


def _blueprint(name: str) -> str:
    return (f'[agent]\nname = "{name}"\ncommand = ["sh", "-c", {PROBE!r}]\n'
            .replace("'", '"'))


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.add_user(USER, ("leviath",))
    setup = ("mkdir -p ~/r ~/elsewhere ~/specs ~/out ~/bp/a ~/bp/b ~/.config/leviath ~/.ssh/k && "
             "echo spec-text > ~/specs/f && echo out-text > ~/out/f && "
             "cat > ~/.config/leviath/config.toml")
    testbed.run(setup, user=USER, input=CONFIG)
    for name in ("a", "b"):
        testbed.run(f"cat > ~/bp/{name}/blueprint.toml", user=USER, input=_blueprint(name))
    try:
        yield testbed
    finally:
        testbed.run(["userdel", "-r", "-f", USER], check=False)
        testbed.users.pop(USER, None)


def _run(bed: Testbed, agent: str, workdir: str) -> tuple[int, str]:
    home = bed.users[USER].home
    r = bed.run(f"lev run ~/bp/{agent} --workdir ~/{workdir}", user=USER, check=False,
                cwd=f"{home}/{workdir}", input="")
    return r.returncode, r.stdout + r.stderr


def test_agent_a_in_the_repository_sees_its_folders_at_their_access(bed: Testbed) -> None:
    home = bed.users[USER].home
    rc, out = _run(bed, "a", "r")
    assert rc == 0, out
    assert "spec-text" in out and "out-text" in out, out
    assert "Read-only file system" in out, out  # ~/specs/w
    assert "out-written" in out, out
    assert bed.read_file(f"{home}/out/w").strip() == "w"
    assert bed.run(["test", "-e", f"{home}/specs/w"], check=False).returncode != 0


def test_agent_a_elsewhere_and_agent_b_in_the_repository_see_neither(bed: Testbed) -> None:
    for agent, workdir in (("a", "elsewhere"), ("b", "r")):
        rc, out = _run(bed, agent, workdir)
        assert rc == 0, out
        assert "spec-text" not in out and "out-text" not in out, (agent, workdir, out)
        assert f"absent:{bed.users[USER].home}/specs/f" in out, out


def test_a_folder_inside_ssh_is_refused(bed: Testbed) -> None:
    bed.run("cat >> ~/.config/leviath/config.toml", user=USER,
            input='\n[[folders]]\npath = "~/.ssh/k"\nagent = "a"\n')
    try:
        rc, out = _run(bed, "a", "r")
        assert rc != 0 and "hidden path" in out, out
    finally:
        bed.run("cat > ~/.config/leviath/config.toml", user=USER, input=CONFIG)
