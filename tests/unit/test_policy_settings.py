"""The gate reads the foundation's merged `Effective` as the daemon will."""

from __future__ import annotations

from pathlib import Path

from leviathd.config.load import parse_blueprint, parse_config
from leviathd.config.merge import resolve
from leviathd.domain.sensitivity import Sensitivity
from leviathd.policy.gate import Call, decide
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
    s = PolicySettings.from_effective(merged.agent)
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
    s = PolicySettings.from_effective(resolve(machine, user, None, "a").agent, machine)
    assert s.credentials["api"].command == ("curl",)
    assert s.credentials["api"].secret_file == "/etc/k"
    assert s.credentials["api"].from_machine is True
    assert s.credentials["mine"].secret_command == ("pass", "gh")
    assert s.credentials["mine"].from_machine is False
    # Without the machine config to compare with, nothing is fetched as root.
    s = PolicySettings.from_effective(resolve(machine, user, None, "a").agent)
    assert not any(c.from_machine for c in s.credentials.values())
