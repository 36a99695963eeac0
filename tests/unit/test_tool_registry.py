"""The tool registry (leviathd/domain/tools.py) is the one list of tools:
the config's unknown-tool finding, the gate's permission step, the broker's
argument check, `lev mcp` and the clearances all answer from it."""

from __future__ import annotations

import pytest

from leviathd.broker.schema import validate
from leviathd.cli.mcp import tools_list
from leviathd.config.load import parse_config
from leviathd.config.merge import resolve
from leviathd.domain.permission import Permission
from leviathd.domain.sensitivity import Sensitivity
from leviathd.domain.tools import TOOLS, Param, SendsOut, Tool, ToolKind, checked_tool_name
from leviathd.errors import InvalidArgument
from leviathd.policy.labels import clearance_for, is_outbound
from leviathd.policy.permissions import permission_for
from leviathd.policy.settings import CompiledPolicy, PolicySettings


def _unknown_tool_findings(table: str) -> set[str]:
    cfg = parse_config(f"[tool_permissions]\n{table}\n", "config.toml")
    found = resolve(cfg, None, None, "a").findings
    return {f.message for f in found if f.code == "unknown-tool"}


def test_every_registered_tool_is_known_to_the_config_and_the_gate() -> None:
    table = "\n".join(f'{name} = "ask"' for name in TOOLS)
    assert _unknown_tool_findings(table) == set()
    for name in TOOLS:
        assert permission_for(name, {}).source == "default"


def test_a_name_outside_the_registry_is_unknown_everywhere() -> None:
    # web_search is the spec's tool leviathd does not have (issue 21).
    assert _unknown_tool_findings('web_search = "allow"')
    assert permission_for("web_search", {"web_search": Permission.ALLOW}).permission == "deny"
    assert clearance_for("web_search", {}, network=True) is None
    assert "web_search" not in {t["name"] for t in tools_list()}


def test_mcp_offers_exactly_the_registry_with_its_schemas() -> None:
    # But the git tools (git's credential helper's) and ssh_sign (the SSH
    # agent's): a model is not offered tokens (issue 15).
    assert {t["name"]: t["inputSchema"] for t in tools_list()} == {
        name: tool.input_schema() for name, tool in TOOLS.items()
        if tool.kind not in (ToolKind.GIT, ToolKind.SSH)
    }


def test_positional_params_are_params_of_the_tool() -> None:
    for tool in TOOLS.values():
        names = {p.name for p in tool.params}
        assert set(tool.positional) <= names, tool.name
        assert tool.variadic is None or tool.variadic in names, tool.name


def test_clearance_exactly_for_the_tools_that_send_out() -> None:
    policy = CompiledPolicy(PolicySettings(network=True), home="/nonexistent", workdir="/")
    for name, tool in TOOLS.items():
        sends = tool.sends_out is not SendsOut.NEVER
        assert (policy.clearances[name] is not None) == sends, name
        assert is_outbound(name, network=True) == sends, name
    # The shell sends out only through a network.
    assert is_outbound("shell", network=False) is False
    assert clearance_for("shell", {}, network=False) is None


def test_the_alias_names_the_same_tool() -> None:
    assert checked_tool_name("bash") == "shell"
    assert TOOLS.find("bash") is TOOLS["shell"]
    assert permission_for("bash", {"shell": Permission.ASK}).permission == "ask"
    with pytest.raises(InvalidArgument):
        checked_tool_name("two words")


def test_the_broker_checks_arguments_against_the_registry_schema() -> None:
    validate("read_file", {"path": "x"})
    with pytest.raises(InvalidArgument, match="unknown argument"):
        validate("read_file", {"path": "x", "extra": 1})
    with pytest.raises(InvalidArgument, match="missing argument"):
        validate("http_post", {"url": "https://example.org/"})


def test_a_larger_registry_for_an_agent_leaves_the_builtin_one_alone() -> None:
    extra = Tool("lint", "Run the linter.", (Param("path", "string"),), ToolKind.SHELL,
                 Sensitivity.INTERNAL)
    mine = TOOLS.with_tools(extra)
    assert mine["lint"] is extra
    assert "lint" not in TOOLS
    assert permission_for("lint", {}, mine).source == "default"
    assert permission_for("lint", {}).source == "unknown-tool"
    with pytest.raises(ValueError, match="twice"):
        TOOLS.with_tools(Tool("shell", "", (), ToolKind.SHELL, Sensitivity.PUBLIC))
    with pytest.raises(ValueError, match="twice"):
        TOOLS.with_tools(Tool("bash", "", (), ToolKind.SHELL, Sensitivity.PUBLIC))
