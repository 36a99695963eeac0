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
    testbed.run("mkdir -p ~/bp/c ~/extra && cat > ~/bp/c/blueprint.toml", user=USER,
                input='[agent]\nname = "c"\ncommand = ["sleep", "600"]\n')
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


def test_lev_folder_add_refuses_a_hidden_folder(bed: Testbed) -> None:
    r = bed.run("lev folder add ~/.ssh/k --agent a", user=USER, check=False)
    assert r.returncode != 0 and "hidden path" in r.stderr, (r.stdout, r.stderr)
    assert ".ssh" not in bed.run("cat ~/.config/leviath/config.toml", user=USER).stdout


def test_a_folder_added_while_the_agent_runs_takes_effect_after_lev_restart(
    bed: Testbed,
) -> None:
    home = bed.users[USER].home
    old = bed.run("lev run ~/bp/c --workdir ~/r --detach", user=USER).stdout.strip()
    new = ""
    try:
        r = bed.run("lev folder add ~/extra --agent c --repository ~/r --write", user=USER)
        assert f"agent c ({old}) is running" in r.stdout, r.stdout
        assert f"lev restart {old}" in r.stdout, r.stdout
        assert f"{home}/extra" not in bed.run(["lev", "inspect", old], user=USER).stdout
        r = bed.run(["lev", "restart", old], user=USER)
        new = r.stdout.strip()
        assert new and new != old, (r.stdout, r.stderr)
        shown = bed.run(["lev", "inspect", new], user=USER).stdout
        line = next((ln for ln in shown.splitlines() if f"{home}/extra " in ln), shown)
        assert "read-write" in line and "folder for agent c and repository ~/r" in line, line
        assert f"{home}/r " in shown  # the same workdir
        ps = bed.run(["lev", "ps", "--all", "--json"], user=USER).stdout
        assert old in ps and new in ps
        bed.run("lev add ~/bp/c", user=USER)
        listed = bed.run("lev list", user=USER).stdout
        assert "folder ~/extra (read-write) when in ~/r" in listed, listed
        # And taken out again: the running agent keeps it until its next start.
        r = bed.run("lev folder remove ~/extra --agent c", user=USER)
        assert "~/extra (read-write) for agent c in ~/r: removed" in r.stdout, r.stdout
        assert f"agent c ({new}) is running: it keeps the folder" in r.stdout, r.stdout
        folders = bed.run("lev folder list", user=USER).stdout
        assert "~/extra" not in folders and "~/specs" in folders, folders
        again = bed.run("lev folder remove ~/extra", user=USER, check=False)
        assert again.returncode != 0 and "no folder ~/extra" in again.stderr, again
    finally:
        for agent_id in (old, new):
            if agent_id:
                bed.run(["lev", "stop", agent_id], user=USER, check=False)
        bed.run("cat > ~/.config/leviath/config.toml", user=USER, input=CONFIG)


def test_the_container_kind_shows_the_folders_at_their_access_too(bed: Testbed) -> None:
    from test_container import BUILD_IMAGE, IMAGE

    home = bed.users[USER].home
    bed.run(BUILD_IMAGE, timeout=300)
    bed.write_file("/etc/leviath/config.toml",
                   f'[sandbox]\nkind = "container"\nimage = "{IMAGE}"\nnetwork = false\n')
    bed.run(["systemctl", "restart", "leviathd"])
    bed.run(f"rm -f {home}/out/w")
    try:
        rc, out = _run(bed, "a", "r")
        assert rc == 0, out
        assert "spec-text" in out and "out-text" in out and "out-written" in out, out
        assert "Read-only file system" in out, out
        assert bed.read_file(f"{home}/out/w").strip() == "w"
        import json

        rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user=USER).stdout)
        assert rows[-1]["agent"] == "a" and rows[-1]["sandbox"] == "container", rows[-1]
        rc, out = _run(bed, "b", "r")
        assert rc == 0, out
        assert "spec-text" not in out and "out-text" not in out, out
    finally:
        bed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
        bed.run(["systemctl", "restart", "leviathd"])
