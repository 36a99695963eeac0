"""What the gate service adds to an agent's sandbox spec, and the policy
snapshot an adopted agent is served with. Pure values: no root, no daemon."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from leviathd.config.load import parse_config
from leviathd.config.merge import Effective, resolve
from leviathd.config.models import SandboxKind
from leviathd.config.policy_settings import policy_settings
from leviathd.domain.credentials import CredentialSpec
from leviathd.gate.service import GateService
from leviathd.identity import UserInfo
from leviathd.policy.settings import CompiledPolicy, PolicySettings
from leviathd.sandbox.spec import RunRequest, SandboxSpec, build_spec

HOME = "/home/alice"
ALICE = UserInfo("alice", 1000, 1000, (1000,), HOME, "/bin/bash")
AGENT = "0123abcd"


def spec_for(kind: SandboxKind, hidden: list[str] | None = None) -> SandboxSpec:
    effective = Effective(kind=kind, hidden_paths=hidden or [])
    return build_spec(
        effective, ALICE, RunRequest(("sh",), f"{HOME}/app"), AGENT,
        existing=lambda _p: True, links={"/bin": "usr/bin"},
    )


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GateService:
    monkeypatch.setenv("LEVIATH_RUNTIME_DIR", "/run/leviath")
    agents: Any = object()
    return GateService(agents, state_dir=str(tmp_path))


def test_a_namespace_agent_gets_only_its_own_folder_read_only_at_run_leviath(
    gate: GateService,
) -> None:
    before = spec_for(SandboxKind.NAMESPACE)
    assert "/run/leviath" in before.hidden
    spec = gate.extend_spec(before)
    bind = spec.mounts[-1]
    assert (bind.kind, bind.source, bind.target, bind.readonly) == (
        "bind", f"/run/leviath/agents/{AGENT}", "/run/leviath", True)
    assert spec.env["LEVIATH_BROKER"] == "/run/leviath/broker.sock"
    # Only the runtime folder itself leaves the hidden list; the rest stays.
    assert "/run/leviath" not in spec.hidden
    assert set(before.hidden) - set(spec.hidden) == {"/run/leviath"}


def test_an_unsandboxed_agent_is_told_the_host_path_and_nothing_is_mounted(
    gate: GateService,
) -> None:
    before = spec_for(SandboxKind.NONE)
    spec = gate.extend_spec(before)
    assert spec.mounts == before.mounts and spec.hidden == before.hidden
    assert spec.env["LEVIATH_BROKER"] == f"/run/leviath/agents/{AGENT}/broker.sock"


def test_an_admins_broader_hidden_path_wins_over_the_broker_socket(gate: GateService) -> None:
    before = spec_for(SandboxKind.NAMESPACE, hidden=["/run"])
    spec = gate.extend_spec(before)
    assert spec.mounts == before.mounts and "LEVIATH_BROKER" not in spec.env
    assert "/run" in spec.hidden and "/run/leviath" in spec.hidden
    assert any("tool broker not bound" in n for n in spec.notes)


def test_a_policy_snapshot_round_trips_to_the_same_compiled_policy() -> None:
    machine = parse_config("""
[tool_permissions]
shell = "ask"
web_fetch = "deny"
[agent_read_paths.a]
allow = ["~/docs"]
[taint]
enabled = true
on_exceed = "deny"
budget = 7
approval_timeout = 9
clearance = { http_post = "public" }
allow_private_addresses = true
[[allowlist]]
tool = "http_post"
target = "*.example.org"
max_sensitivity = "private"
[credentials.api]
command = ["curl"]
secret_file = "/etc/k"
env = "K"
[credentials.gitsrv]
kind = "git"
hosts = ["git.example.org:8443"]
access = ["fetch", "push"]
allow_http = true
secret_file = "/etc/g"
[credentials.gh]
kind = "cli"
command = ["/usr/bin/gh"]
token_env = "GH_TOKEN"
secret_file = "/etc/h"
[credentials.deploy]
kind = "ssh"
hosts = ["*.example.org"]
known_hosts = ["/etc/ssh/ssh_known_hosts"]
secret_file = "/etc/s"
[[rules]]
name = "no-pem"
when = 'call.target.endsWith(".pem")'
decision = "deny"
reason = "keys"
""", "m")
    from leviathd.config.load import parse_blueprint

    bp = parse_blueprint('[agent]\nname = "a"\ncommand = ["x"]\n[read_paths]\n'
                         'allow = ["~/docs"]\n[[rules]]\nname = "bp"\nwhen = "true"\n'
                         'decision = "ask"\n', "bp")
    original = policy_settings(resolve(machine, None, bp, "a").agent, machine)
    copy = PolicySettings.from_snapshot(original.to_snapshot())
    assert copy == original
    a = CompiledPolicy(original, home=HOME, workdir=f"{HOME}/app")
    b = CompiledPolicy(copy, home=HOME, workdir=f"{HOME}/app")
    assert a.permissions == b.permissions and a.clearances == b.clearances
    assert [r.describe() for r in a.allowlist.rules] == [r.describe() for r in b.allowlist.rules]
    assert b.grant.match(f"{HOME}/docs/x") is not None
    # An agent adopted after a restart keeps the rules it started with.
    assert [(r.layer, r.name, r.decision) for r in copy.rules] == [
        ("machine", "no-pem", "deny"), ("blueprint", "bp", "ask")]
    assert copy.credentials["api"].from_machine is True
    # Credential kinds and their settings too (issue 15).
    assert copy.credentials["gh"].wrap == "gh" and copy.credentials["gh"].token_env == "GH_TOKEN"
    assert copy.credentials["gitsrv"].access == ("fetch", "push")
    assert copy.credentials["deploy"].kind == "ssh"
    assert (copy.on_exceed, copy.budget, copy.approval_timeout) == ("deny", 7, 9.0)


def test_a_snapshot_from_before_credential_kinds_reads_as_command_credentials() -> None:
    import json

    data = json.loads(PolicySettings(credentials={"api": CredentialSpec(("curl",), "/k")})
                      .to_snapshot())
    old = data["credentials"]["api"]
    for key in ("kind", "hosts", "username", "access", "allow_http", "wrap", "token_env",
                "known_hosts"):
        del old[key]
    spec = PolicySettings.from_snapshot(json.dumps(data)).credentials["api"]
    assert spec.kind == "command" and spec.command == ("curl",)


def test_an_agent_with_stages_whose_step_is_unknown_gets_no_guessed_fence(
    gate: GateService,
) -> None:
    """The last stage's fence may be looser than the one the agent runs in
    (a plan stage without network before a build stage with it): with no step
    record (a full state disk) shell and blueprint tools are refused, not run
    in the last fence. A live agent is stood in by a plain value here."""
    from types import SimpleNamespace

    from leviathd.errors import Unavailable

    gate.live[AGENT] = SimpleNamespace(rec=SimpleNamespace(running=True))  # type: ignore[assignment]
    build = spec_for(SandboxKind.NAMESPACE)
    plan = dataclasses.replace(build, network=False)
    build = dataclasses.replace(build, network=True)
    gate._store.ensure()
    gate._store.save_spec(AGENT, [("stage plan", plan.to_dict()),
                                  ("stage build", build.to_dict())])
    with pytest.raises(Unavailable, match="not recorded"):
        gate._agent_spec(AGENT)
    gate._store.save_spec(AGENT, [("command", build.to_dict())])
    assert gate._agent_spec(AGENT)[1] == build  # one step: no doubt which
