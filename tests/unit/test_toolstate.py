"""Which agent tools' state is made before a fence (sandbox/toolstate.py):
only for a tool that is installed on the toolchain paths or named by the
command, only what is missing, never what is hidden."""

from __future__ import annotations

from leviathd.sandbox.toolstate import TOOLS, missing_state

HOME = "/home/alice"


def _missing(present: set[str], argvs: list[list[str]],
             listing: dict[str, list[str]] | None = None,
             hidden: tuple[str, ...] = ()) -> list[tuple[str, bool, str]]:
    out = missing_state(
        HOME, argvs, lambda p: p in present, lambda p: (listing or {}).get(p, []),
        hidden=lambda p: any(p == h or p.startswith(h + "/") for h in hidden),
    )
    return [(m.rel, m.folder, m.why) for m in out]


def test_nothing_is_made_for_a_user_without_agent_tools() -> None:
    assert _missing(set(), [["make", "test"]]) == []


def test_an_installed_tool_gets_its_missing_state() -> None:
    got = _missing({f"{HOME}/.npm-global/bin/codex", f"{HOME}/.local/bin/claude",
                    f"{HOME}/.claude"}, [["sh"]])
    assert got == [(".claude.json", False, "installed"), (".codex", True, "installed")]


def test_a_tool_under_nvm_is_found_in_each_version() -> None:
    nvm = f"{HOME}/.nvm/versions/node"
    got = _missing({f"{nvm}/v22.1.0/bin/gemini"}, [["sh"]], {nvm: ["v20.0.0", "v22.1.0"]})
    assert got == [(".gemini", True, "installed")]


def test_a_tool_named_by_the_command_gets_its_state_even_if_not_installed() -> None:
    got = _missing(set(), [["/usr/bin/true"], ["/opt/x/bin/opencode", "run"]])
    assert got == [(".config/opencode", True, "named by the command"),
                   (".local/share/opencode", True, "named by the command")]


def test_a_hidden_state_path_is_not_made() -> None:
    got = _missing(set(), [["claude"]], hidden=(f"{HOME}/.claude",))
    assert got == [(".claude.json", False, "named by the command")]


def test_every_tool_state_is_bound_by_the_spec() -> None:
    from leviathd.sandbox.spec import AGENT_STATE

    for tool in TOOLS:
        for entry in tool.state:
            assert entry.rstrip("/") in AGENT_STATE, entry
