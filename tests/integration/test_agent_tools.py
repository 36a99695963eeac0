"""The agent CLIs people install per user are found and work inside the
sandbox: each layout of docs/sandbox.md's table is built in alice's home with
a stand-in script at the vendor's paths (links as the installer makes them),
so that the layout, not the vendor's binary, is what is tested. Each stand-in
reads its config and writes its state; the binary's folder is read-only."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from testbed import Testbed


@dataclass
class Layout:
    name: str
    command: str  # what the user types, found on PATH
    path_dir: str  # the folder the installer puts on PATH, under ~
    binary: str  # where the program really is, under ~
    link: str | None  # the link on PATH (under ~) and what it says, or None
    link_target: str | None
    state: str  # a folder of its state, under ~ (written by the stand-in)
    config: str | None = None  # a file of its state, under ~ (read by the stand-in)


LAYOUTS = [
    Layout("claude-code-native", "claude", ".local/bin", ".local/share/claude/versions/2.0.14",
           ".local/bin/claude", "{home}/.local/share/claude/versions/2.0.14", ".claude",
           ".claude.json"),
    Layout("codex-npm-global-prefix", "codex", ".npm-global/bin",
           ".npm-global/lib/node_modules/@openai/codex/bin/codex.js", ".npm-global/bin/codex",
           "../lib/node_modules/@openai/codex/bin/codex.js", ".codex"),
    Layout("gemini-npm-prefix-local", "gemini", ".local/bin",
           ".local/lib/node_modules/@google/gemini-cli/dist/index.js", ".local/bin/gemini",
           "../lib/node_modules/@google/gemini-cli/dist/index.js", ".gemini"),
    Layout("aider-pipx", "aider", ".local/bin", ".local/share/pipx/venvs/aider-chat/bin/aider",
           ".local/bin/aider", "{home}/.local/share/pipx/venvs/aider-chat/bin/aider", ".aider",
           ".aider.conf.yml"),
    Layout("uv-tool", "ruff-standin", ".local/bin",
           ".local/share/uv/tools/ruff-standin/bin/ruff-standin", ".local/bin/ruff-standin",
           "{home}/.local/share/uv/tools/ruff-standin/bin/ruff-standin", ".cache/uv"),
    Layout("opencode-install-script", "opencode", ".opencode/bin", ".opencode/bin/opencode",
           None, None, ".local/share/opencode", ".config/opencode/opencode.json"),
    Layout("nvm-npm-global", "npx-standin", ".nvm/versions/node/v22.11.0/bin",
           ".nvm/versions/node/v22.11.0/lib/node_modules/npx-standin/cli.js",
           ".nvm/versions/node/v22.11.0/bin/npx-standin", "../lib/node_modules/npx-standin/cli.js",
           ".npm"),
]

STANDIN = """#!/bin/sh
set -e
{read}
echo "$$ {name}" > "$HOME/{state}/standin-wrote"
if touch "$0.new" 2>/dev/null; then echo binary-writable; else echo binary-read-only; fi
echo "{name} ran as $(id -un)"
"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.run(["mkdir", "-p", "tools-work"], user="alice")
    yield testbed
    # What the layouts laid in alice's home goes: a stand-in `claude` on her
    # PATH or its one-line ~/.claude.json would be what later modules' real
    # agent CLIs meet (test_cli_logins' claude read it as a corrupt config).
    home = testbed.users["alice"].home
    made = {p for x in LAYOUTS for p in (x.binary, x.link, x.config, x.state) if p}
    testbed.run(["rm", "-rf", "--", *(f"{home}/{p}" for p in sorted(made)), f"{home}/tools-work"],
                check=False)


def _install(bed: Testbed, layout: Layout) -> None:
    home = bed.users["alice"].home
    read = f'cat "$HOME/{layout.config}"' if layout.config else "true"
    script = STANDIN.format(read=read, name=layout.name, state=layout.state)
    binary = f"{home}/{layout.binary}"
    bed.run(f"mkdir -p \"$(dirname '{binary}')\" '{home}/{layout.state}' '{home}/{layout.path_dir}'"
            f" && cat > '{binary}' && chmod 755 '{binary}'", user="alice", input=script)
    if layout.link and layout.link_target:
        bed.run(["ln", "-sfn", layout.link_target.format(home=home), f"{home}/{layout.link}"],
                user="alice")
    if layout.config:
        bed.run(f"mkdir -p \"$(dirname '{home}/{layout.config}')\" && "
                f"echo 'config-of-{layout.name}' > '{home}/{layout.config}'", user="alice")


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.name)
def test_an_agent_tool_installed_the_vendors_way_runs_inside(bed: Testbed, layout: Layout) -> None:
    home = bed.users["alice"].home
    _install(bed, layout)
    r = bed.run(f"PATH=$HOME/{layout.path_dir}:$PATH lev run -- {layout.command}",
                user="alice", cwd=f"{home}/tools-work", check=False)
    assert r.returncode == 0, (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    if layout.config:
        assert f"config-of-{layout.name}" in lines, r.stdout
    assert "binary-read-only" in lines, r.stdout
    assert f"{layout.name} ran as alice" in lines, r.stdout
    wrote = bed.run(["cat", f"{home}/{layout.state}/standin-wrote"], user="alice").stdout
    assert layout.name in wrote
