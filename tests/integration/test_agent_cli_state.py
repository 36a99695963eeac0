"""The real Claude Code and Codex CLIs keep their state on the host from a
user's very first run (issue 33 item 3): with ~/.claude, ~/.claude.json and
~/.codex missing, what the tools write inside an agent used to land in the
agent's scratch home and be gone at its end (every run logged out, no session
to resume).

The npm packages are the vendors' own (pinned in scripts/setup, which fetches
them into /opt/leviath-dev/npm/prefix); the test copies that `npm i -g`
prefix into a fresh user's ~/.npm-global, as her own files, which is what
`npm i -g --prefix ~/.npm-global` leaves. No network is needed: the bed has
none, so the tools fail to reach their APIs, which is fine here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest
from testbed import Testbed

NPM_PREFIX = "/opt/leviath-dev/npm/prefix"
USER = "nora"
WORK = "cli-work"
PATH = "PATH=$HOME/.npm-global/bin:$PATH"


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    for tool in ("claude", "codex"):
        if not os.path.exists(f"{NPM_PREFIX}/bin/{tool}"):
            pytest.fail(f"{NPM_PREFIX}/bin/{tool} is missing: run scripts/setup (it fetches the "
                        "pinned npm packages)")
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.add_user(USER, ("leviath",))
    home = testbed.users[USER].home
    testbed.run(f"cp -a {NPM_PREFIX} $HOME/.npm-global && mkdir -p $HOME/{WORK}", user=USER,
                timeout=300)
    for name in (".claude", ".claude.json", ".codex"):
        assert testbed.run(["test", "-e", f"{home}/{name}"], check=False).returncode != 0
    try:
        yield testbed
    finally:
        testbed.run(["userdel", "-r", "-f", USER], check=False)
        testbed.users.pop(USER, None)


def _agent(bed: Testbed, command: str, timeout: int = 120) -> tuple[int, str]:
    home = bed.users[USER].home
    r = bed.run(f"{PATH} lev run -- {command}", user=USER, cwd=f"{home}/{WORK}", check=False,
                timeout=timeout, input="")
    return r.returncode, r.stdout + r.stderr


def _owner_mode(bed: Testbed, path: str) -> tuple[str, str]:
    out = bed.run(["stat", "-c", "%U %a %F", path]).stdout.split(maxsplit=2)
    return out[0], out[1] + " " + out[2].strip()


def test_the_real_clis_run_inside_and_keep_their_state_on_the_host(bed: Testbed) -> None:
    home = bed.users[USER].home
    rc, out = _agent(bed, "claude --version")
    assert rc == 0 and "Claude Code" in out, out
    rc, out = _agent(bed, "codex --version")
    assert rc == 0 and "codex-cli" in out, out

    # No login and no network: both fail to reach their APIs, which is fine;
    # Codex retries for minutes, so `timeout` ends it (its state is written
    # at its start).
    _agent(bed, "timeout 60 claude -p hello")
    _agent(bed, "timeout 20 codex exec --skip-git-repo-check hello")

    assert _owner_mode(bed, f"{home}/.claude") == (USER, "700 directory")
    assert _owner_mode(bed, f"{home}/.codex") == (USER, "700 directory")
    owner, mode = _owner_mode(bed, f"{home}/.claude.json")
    assert owner == USER and mode.startswith("600 regular"), mode
    # What Claude Code wrote inside is on the host: its config holds more than
    # the "{}" it was made with, and its state folder is not empty.
    written = json.loads(bed.read_file(f"{home}/.claude.json"))
    assert written, "~/.claude.json on the host holds nothing Claude Code wrote"
    host_claude = set(bed.run(["ls", "-A", f"{home}/.claude"]).stdout.split())
    assert host_claude - {"settings.json", "settings.local.json", "plugins"}, host_claude
    host_codex = set(bed.run(["ls", "-A", f"{home}/.codex"]).stdout.split())
    assert host_codex - {"config.toml"}, host_codex
    for path in bed.run(["find", f"{home}/.claude", f"{home}/.codex", f"{home}/.claude.json",
                         "-printf", "%u %p\\n"]).stdout.splitlines():
        assert path.startswith(f"{USER} "), path

    # A second agent sees what the first wrote.
    rc, out = _agent(bed, "sh -c 'cat ~/.claude.json; ls -A ~/.claude ~/.codex'")
    assert rc == 0, out
    for key in written:
        assert key in out, (key, out)
    for name in (host_claude | host_codex) - {"settings.json", "settings.local.json", "plugins",
                                              "config.toml"}:
        assert name in out, (name, out)


def test_the_claude_settings_stay_read_only_inside(bed: Testbed) -> None:
    home = bed.users[USER].home
    rc, out = _agent(bed, "claude --version")
    assert rc == 0, out
    rc, out = _agent(
        bed, "sh -c 'echo {\\\"hooks\\\":1} > ~/.claude/settings.json; echo rc=$?; "
             "echo state > ~/.claude/mine; echo mine=$?'")
    assert "rc=0" not in out and "Read-only file system" in out, out
    assert "mine=0" in out, out
    assert "hooks" not in bed.read_file(f"{home}/.claude/settings.json")
    assert bed.read_file(f"{home}/.claude/mine").strip() == "state"
    # Codex's config.toml (its notify command runs on the host) likewise.
    rc, out = _agent(bed, "sh -c 'echo notify = 1 > ~/.codex/config.toml; echo rc=$?'")
    assert "rc=0" not in out and "Read-only file system" in out, out
    assert "notify" not in bed.read_file(f"{home}/.codex/config.toml")


def test_a_caller_polkit_refuses_makes_nothing_in_her_home(bed: Testbed) -> None:
    """A caller polkit never allowed is waited for before anything of her
    start runs (agents/service.py); toolstate.prepare also waits for the
    answer itself before it makes anything, for a caller allowed before
    whose answer is still pending (not reproducible here on demand)."""
    carol = bed.users["carol"]  # in no group: polkit refuses her agents
    bed.run(["rm", "-rf", f"{carol.home}/.codex"])
    r = bed.run("lev run -- codex --version", user="carol", check=False, input="")
    assert r.returncode != 0, r.stdout
    assert bed.run(["test", "-e", f"{carol.home}/.codex"], check=False).returncode != 0


def test_lev_inspect_says_what_will_be_made(bed: Testbed) -> None:
    """Before any agent ran for her, inspect names the state the start makes."""
    bed.add_user("nell", ("leviath",))
    try:
        bed.run(f"mkdir -p ~/bp ~/{WORK} && printf '[agent]\\nname = \"g\"\\n"
                "command = [\"gemini\", \"-p\", \"hi\"]\\n' > ~/bp/blueprint.toml", user="nell")
        out = bed.run(f"cd ~/{WORK} && lev inspect ~/bp", user="nell").stdout
        assert "~/.gemini: missing; made as you (folder 0700) when the agent starts" in out, out
        assert bed.run(["test", "-e", f"{bed.users['nell'].home}/.gemini"],
                       check=False).returncode != 0  # inspect makes nothing
    finally:
        bed.run(["userdel", "-r", "-f", "nell"], check=False)
        bed.users.pop("nell", None)
