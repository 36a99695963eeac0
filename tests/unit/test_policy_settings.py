"""The gate reads the foundation's merged `Effective` as the daemon will."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from leviathd.config.load import parse_blueprint, parse_config
from leviathd.config.merge import resolve
from leviathd.config.policy_settings import policy_settings
from leviathd.domain.sensitivity import Sensitivity
from leviathd.policy.decision import Call, decide
from leviathd.policy.settings import CompiledPolicy, PolicySettings

MACHINE = """
[tool_permissions]
shell = "ask"

[taint]
enabled = true
on_exceed = "deny"
budget = 8
clearance = { http_post = "public" }

[[allowlist]]
tool = "http_post"
target = "*.corp.example"
max_sensitivity = "private"

[agent_read_paths.cto]
allow = ["~/notes"]
"""

BLUEPRINT = """
[agent]
name = "cto"
command = ["true"]

[read_paths]
allow = ["~/notes", "~/other"]

[permissions]
web_fetch = "deny"
"""


def test_settings_from_the_merged_effective_reach_the_gate(tmp_path: Path) -> None:
    merged = resolve(parse_config(MACHINE, "machine"), None,
                     parse_blueprint(BLUEPRINT, "bp"), "cto")
    s = policy_settings(merged.agent)
    assert (s.taint_enabled, s.on_exceed, s.budget) == (True, "deny", 8)
    assert list(s.read_paths) == ["~/notes"]  # declared and granted only
    home, work = tmp_path / "home", tmp_path / "work"
    (home / "notes").mkdir(parents=True)
    work.mkdir()
    pol = CompiledPolicy(s, home=str(home), workdir=str(work))
    X = Sensitivity.PRIVATE
    assert decide(pol, Call("web_fetch", "x.org"), Sensitivity.PUBLIC).outcome == "deny"
    assert decide(pol, Call("shell", "ls"), Sensitivity.PUBLIC).outcome == "ask"
    assert decide(pol, Call("http_post", "a.corp.example"), X).rule == "allowlist#1"
    assert decide(pol, Call("http_post", "elsewhere.org"), Sensitivity.INTERNAL).rule == (
        "on_exceed=deny")
    other = str(home / "other" / "f")
    assert decide(pol, Call("read_file", other, (other,)), X).rule == "read-path-not-granted"


def test_only_the_machines_credentials_are_fetched_as_root() -> None:
    machine = parse_config(
        '[credentials.api]\ncommand = ["curl"]\nsecret_file = "/etc/k"\nenv = "K"\n', "m"
    )
    user = parse_config(
        '[credentials.mine]\ncommand = ["gh"]\nsecret_command = ["pass", "gh"]\nenv = "T"\n',
        "u",
    )
    s = policy_settings(resolve(machine, user, None, "a").agent, machine)
    assert s.credentials["api"].command == ("curl",)
    assert s.credentials["api"].secret_file == "/etc/k"
    assert s.credentials["api"].from_machine is True
    assert s.credentials["mine"].secret_command == ("pass", "gh")
    assert s.credentials["mine"].from_machine is False
    # Without the machine config to compare with, nothing is fetched as root.
    s = policy_settings(resolve(machine, user, None, "a").agent)
    assert not any(c.from_machine for c in s.credentials.values())


def test_an_object_missing_fields_is_refused_not_read_as_defaults() -> None:
    # The old reader took any object and filled what it lacked with permissive
    # defaults: an object with no fields gave valid settings that allowed all.
    with pytest.raises(AttributeError):
        policy_settings(SimpleNamespace())  # type: ignore[arg-type]
    eff = resolve(parse_config(MACHINE, "machine"), None, None, "cto").agent
    bare = SimpleNamespace(**{f.name: getattr(eff, f.name) for f in dataclasses.fields(eff)
                              if f.name != "allowlist"})
    with pytest.raises(AttributeError, match="allowlist"):
        policy_settings(bare)  # type: ignore[arg-type]


def test_a_snapshot_missing_a_setting_or_with_a_bad_value_is_refused() -> None:
    machine = parse_config(MACHINE, "machine")
    s = policy_settings(resolve(machine, None, None, "cto").agent, machine)
    assert PolicySettings.from_snapshot(s.to_snapshot()) == s
    whole = json.loads(s.to_snapshot())
    assert whole["clearance"] == {"http_post": "public"}  # names, as the config spells them
    for key in ("permissions", "allowlist", "taint_enabled", "on_exceed", "hidden_paths"):
        cut = {k: v for k, v in whole.items() if k != key}
        with pytest.raises(ValueError, match=key):
            PolicySettings.from_snapshot(json.dumps(cut))
    for key, bad in (("on_exceed", "maybe"), ("budget", "many"), ("permissions", {"x": "?"}),
                     ("allowlist", [{"tool": "http_post", "target": "x"}])):
        with pytest.raises(ValidationError):
            PolicySettings.from_snapshot(json.dumps(whole | {key: bad}))
    # Written before limits and rules existed: their defaults.
    old = {k: v for k, v in whole.items() if k not in ("limits", "rules")}
    assert PolicySettings.from_snapshot(json.dumps(old)).rules == ()


def test_a_user_clearance_above_the_machines_public_one_is_overruled() -> None:
    # Public is 0: it must not read as "not set" and fall back to the default.
    machine = parse_config('[taint.clearance]\nhttp_post = "public"\n', "m")
    user = parse_config('[taint.clearance]\nhttp_post = "internal"\n', "u")
    merged = resolve(machine, user, None, "a")
    assert merged.agent.taint.clearance["http_post"] is Sensitivity.PUBLIC
    assert any(f.code == "taint-overruled" for f in merged.findings)
