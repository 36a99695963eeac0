"""Issue 15 §2: blueprint tools' definitions and calls (leviathd/policy/tooldef.py),
from the side of an agent choosing arguments and a blueprint author choosing
the rest: a value never becomes an option or a second argument, the schema
refuses what it does not allow, and a definition that cannot be checked is
refused at load."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest
from pydantic import ValidationError

from leviathd.config.merge import resolve
from leviathd.config.models import Blueprint, Config
from leviathd.config.policy_settings import policy_settings
from leviathd.errors import InvalidArgument
from leviathd.policy.decision import Call, decide
from leviathd.policy.labels import Sensitivity
from leviathd.policy.settings import CompiledPolicy, PolicySettings
from leviathd.policy.tooldef import (
    ToolDef,
    ToolDefError,
    check_args,
    make_tool,
    positional,
    render,
)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "pattern": {"type": "string", "maxLength": 100},
        "path": {"type": "string", "default": "."},
        "count": {"type": "integer", "minimum": 1, "maximum": 50},
        "mode": {"type": "string", "enum": ["fast", "slow"]},
    },
    "required": ["pattern"],
}


def grep(argv: list[str] | None = None, **kw: Any) -> ToolDef:
    return make_tool("grep_repo", description="search", schema=SCHEMA,
                     argv=argv or ["grep", "-rn", "--max-count={count}", "--", "{pattern}",
                                   "{path}"],
                     output=kw.get("output", "internal"), sends_data=kw.get("sends", False),
                     timeout=30)


def test_a_value_is_one_argument_whatever_it_holds() -> None:
    t = grep()
    argv = render(t, check_args(t, {"pattern": "a b; rm -rf / $(id) `x` *", "count": 3}))
    assert argv == ["grep", "-rn", "--max-count=3", "--", "a b; rm -rf / $(id) `x` *", "."]


def test_a_value_starting_with_a_dash_is_passed_only_after_the_separator() -> None:
    t = grep()
    assert render(t, check_args(t, {"pattern": "-e"}))[3] == "-e"
    before = grep(["grep", "{pattern}", "--", "{path}"])
    with pytest.raises(InvalidArgument, match="would make it an option"):
        render(before, check_args(before, {"pattern": "--include=/etc/shadow"}))
    # Behind a literal prefix it cannot be an option of its own.
    assert render(t, check_args(t, {"pattern": "x", "count": 2}))[2] == "--max-count=2"
    # A '--' that came from a value does not open the way for later values.
    two = make_tool("t", description="", schema={"properties": {
        "a": {"type": "string"}, "b": {"type": "string"}}}, argv=["prog", "{a}", "{b}"],
        output="internal", sends_data=False, timeout=5)
    with pytest.raises(InvalidArgument):
        render(two, check_args(two, {"a": "--", "b": "-rf"}))


def test_arguments_are_checked_against_the_schema() -> None:
    t = grep()
    bad: list[dict[str, Any]] = [
        {},  # pattern missing
        {"pattern": 5},
        {"pattern": "x" * 101},
        {"pattern": "x", "count": 0},
        {"pattern": "x", "count": "3"},
        {"pattern": "x", "count": True},
        {"pattern": "x", "mode": "medium"},
        {"pattern": "x", "extra": "y"},
        {"pattern": "a\0b"},
    ]
    for args in bad:
        with pytest.raises(InvalidArgument):
            check_args(t, args)
    assert check_args(t, {"pattern": "x"}) == {"pattern": "x", "path": "."}


def test_an_absent_optional_argument_drops_its_element() -> None:
    t = grep()
    assert render(t, check_args(t, {"pattern": "x"})) == ["grep", "-rn", "--", "x", "."]


@pytest.mark.parametrize("schema, argv, why", [
    ({"properties": {"p": {"type": "string", "pattern": "^(a+)+$"}}}, ["x", "{p}"], "pattern"),
    ({"properties": {"p": {"type": "array"}}}, ["x", "{p}"], "type must be"),
    ({"properties": {"p": {"type": "object"}}}, ["x", "{p}"], "type must be"),
    ({"properties": {"p": {"type": "string"}}}, ["{p}"], "program must be fixed"),
    ({"properties": {"p": {"type": "string"}}}, ["x", "{p}{p}"], "at most one"),
    ({"properties": {"p": {"type": "string"}}}, ["x", "{q}"], "names no property"),
    ({"properties": {}, "additionalProperties": True}, ["x"], "additionalProperties"),
    ({"type": "array"}, ["x"], "type must be"),
    ({"properties": {"p": {"type": "string"}}, "required": ["q"]}, ["x"], "not a property"),
    ({"properties": {"p": {"type": "string", "default": 3}}}, ["x"], "default"),
    ({"properties": {f"p{i}": {"type": "string"} for i in range(33)}}, ["x"], "at most 32"),
])
def test_a_definition_that_cannot_be_checked_is_refused(
    schema: dict[str, Any], argv: list[str], why: str
) -> None:
    with pytest.raises(ToolDefError, match=why):
        make_tool("t", description="", schema=schema, argv=argv, output="internal",
                  sends_data=False, timeout=5)


def test_a_blueprint_tool_cannot_take_a_built_in_name() -> None:
    for name in ("shell", "bash", "read_file", "list", "bad name", "-x"):
        with pytest.raises(ToolDefError):
            make_tool(name, description="", schema={}, argv=["true"], output="public",
                      sends_data=False, timeout=5)


BLUEPRINT = """
[agent]
name = "bp"
command = ["true"]

[tools.grep_repo]
description = "search the workdir"
argv = ["grep", "-rn", "--", "{pattern}", "."]
output = "private"

[tools.grep_repo.arguments]
type = "object"
required = ["pattern"]

[tools.grep_repo.arguments.properties.pattern]
type = "string"

[tools.upload]
argv = ["curl", "-d", "@-", "https://example.com"]
sends_data = true
"""


def _bp(text: str) -> Blueprint:
    return Blueprint.model_validate(tomllib.loads(text))


def test_a_blueprint_cannot_ask_for_another_fence_or_user_for_its_tool() -> None:
    for extra in ('sandbox = "none"', 'user = "root"', 'host = true', 'kind = "none"'):
        with pytest.raises(ValidationError):
            _bp(BLUEPRINT.replace('output = "private"', f'output = "private"\n{extra}'))
    with pytest.raises(ValidationError, match="built-in"):
        _bp(BLUEPRINT.replace("[tools.upload]", "[tools.shell]"))


def test_the_gate_knows_a_blueprint_tool_its_label_and_its_clearance() -> None:
    merged = resolve(Config(), Config.model_validate(
        {"tool_permissions": {"upload": "ask"}}), _bp(BLUEPRINT), "bp")
    assert not [f for f in merged.findings if f.code == "unknown-tool"], merged.findings
    settings = policy_settings(replace_network(merged.agent, False))
    policy = CompiledPolicy(settings, home="/home/u", workdir="/tmp")
    d = decide(policy, Call("grep_repo", "grep -rn -- x ."), Sensitivity.PUBLIC)
    assert d.outcome == "allow" and d.label == Sensitivity.PRIVATE and d.clearance is None
    d = decide(policy, Call("upload", "curl"), Sensitivity.PRIVATE)
    assert d.outcome == "ask" and d.rule == "permission:upload=ask"
    # Another agent's gate does not know them: fail closed.
    bare = CompiledPolicy(PolicySettings(), home="/home/u", workdir="/tmp")
    assert decide(bare, Call("grep_repo"), Sensitivity.PUBLIC).rule == "unknown-tool"


def test_an_exfiltrating_tool_is_held_above_its_clearance() -> None:
    merged = resolve(Config.model_validate({"taint": {"enabled": True}}), None,
                     _bp(BLUEPRINT), "bp")
    settings = policy_settings(replace_network(merged.agent, False))
    policy = CompiledPolicy(settings, home="/home/u", workdir="/tmp")
    assert policy.clearances["upload"] == Sensitivity.INTERNAL
    assert decide(policy, Call("upload", "x"), Sensitivity.INTERNAL).outcome == "allow"
    d = decide(policy, Call("upload", "x"), Sensitivity.PRIVATE)
    assert (d.outcome, d.ask_kind) == ("ask", "taint")
    # With a network in its fence, even a tool that says it sends nothing can.
    net = CompiledPolicy(policy_settings(replace_network(merged.agent, True)),
                         home="/home/u", workdir="/tmp")
    assert net.clearances["grep_repo"] == Sensitivity.INTERNAL


def test_positional_values_follow_the_schema_order_and_types() -> None:
    t = grep()
    assert positional(t, ["x", "src", "4"]) == {"pattern": "x", "path": "src", "count": 4}
    with pytest.raises(InvalidArgument):
        positional(t, ["x", "src", "four"])


def test_a_definition_survives_its_snapshot_and_a_spoiled_one_does_not() -> None:
    t = grep(output="private", sends=True)
    settings = PolicySettings(tools={t.name: t})
    assert PolicySettings.from_snapshot(settings.to_snapshot()).tools == {t.name: t}
    raw = json.loads(settings.to_snapshot())
    raw["tools"]["grep_repo"]["argv"] = ["{pattern}"]
    with pytest.raises(ValueError, match="program must be fixed"):
        PolicySettings.from_snapshot(json.dumps(raw))


def replace_network(eff: Any, network: bool) -> Any:
    from dataclasses import replace

    return replace(eff, network=network)
