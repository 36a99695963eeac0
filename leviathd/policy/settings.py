"""The policy-relevant part of an agent's effective settings, compiled once
(per agent, per config reload) into indexes the gate can query quickly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from leviathd.broker.limits import Limits
from leviathd.domain.permission import Permission
from leviathd.domain.sensitivity import Sensitivity
from leviathd.domain.tools import TOOLS
from leviathd.hidden import builtin_hidden
from leviathd.policy.allowlist import Allowlist, compile_allowlist
from leviathd.policy.labels import clearance_for
from leviathd.policy.permissions import compile_permissions
from leviathd.policy.readgrant import GrantIndex, build_index
from leviathd.policy.rules import RuleSet, RuleSpec, compile_rules

OnExceed = Literal["allow", "deny", "ask"]


@dataclass(frozen=True)
class CredentialSpec:
    """`[credentials.NAME]`: run `command` (plus the agent's arguments) with the
    secret on its standard input; the secret is the content of `secret_file` or
    the output of `secret_command`. `env` is the retired way (the secret in a
    variable): a credential that still sets it is refused when called.
    `from_machine`: defined by the machine config, so the secret is fetched as
    root (an admin's secret the agent's user cannot read); a user's own
    credential is fetched as that user."""

    command: tuple[str, ...]
    secret_file: str
    env: str = ""
    secret_command: tuple[str, ...] = ()
    from_machine: bool = False
    # Whether its fence shows the agent's workdir (read-only) or nothing of it.
    workdir: Literal["none", "ro"] = "none"


@dataclass(frozen=True)
class PolicySettings:
    permissions: Mapping[str, object] = field(default_factory=dict)
    read_paths: Sequence[str] = ()  # active grants: declared and granted
    hidden_paths: Sequence[str] = ()
    taint_enabled: bool = True
    on_exceed: OnExceed = "ask"
    budget: int = 32
    approval_timeout: float = 120.0
    clearance: Mapping[str, object] = field(default_factory=dict)
    allow_private_addresses: bool = False
    allowlist: Sequence[object] = ()
    network: bool = True
    credentials: Mapping[str, CredentialSpec] = field(default_factory=dict)
    # The broker's limits: from the machine config's [broker] only.
    limits: Limits = field(default_factory=Limits)
    # [[rules]] of the machine, then the user, then the blueprint (tighten-only:
    # the merge dropped the lower layers' allow rules).
    rules: Sequence[RuleSpec] = ()

    @classmethod
    def from_effective(cls, eff: Any, machine: Any = None) -> PolicySettings:
        """From `leviathd.config.merge.Effective` (read by attribute so this
        module does not depend on the config package's import graph).
        `machine`: the machine `Config`, to tell its credentials (fetched as
        root) from a user's (fetched as the user)."""
        taint = getattr(eff, "taint", None)
        machine_creds = dict(getattr(machine, "credentials", None) or {})
        creds: dict[str, CredentialSpec] = {}
        for name, spec in dict(getattr(eff, "credentials", None) or {}).items():
            command = getattr(spec, "command", None)
            secret_file = getattr(spec, "secret_file", None)
            secret_command = getattr(spec, "secret_command", None)
            env = getattr(spec, "env", None)
            if not command or (not secret_file) == (not secret_command):
                continue  # incomplete: the validator reports it; the tool says "not configured"
            creds[str(name)] = CredentialSpec(
                tuple(str(a) for a in command), str(secret_file or ""), str(env or ""),
                secret_command=tuple(str(a) for a in secret_command or ()),
                from_machine=machine_creds.get(name) == spec,
                workdir="ro" if str(getattr(spec, "workdir", "none")) == "ro" else "none",
            )
        on_exceed = str(getattr(taint, "on_exceed", "ask"))
        return cls(
            permissions=dict(getattr(eff, "permissions", None) or {}),
            read_paths=tuple(str(p) for p in getattr(eff, "read_paths_granted", None) or ()),
            hidden_paths=tuple(str(p) for p in getattr(eff, "hidden_paths", None) or ()),
            taint_enabled=bool(getattr(taint, "enabled", True)),
            on_exceed=on_exceed if on_exceed in ("allow", "deny") else "ask",  # type: ignore[arg-type]
            budget=int(getattr(taint, "budget", 32)),
            approval_timeout=float(getattr(taint, "approval_timeout", 120)),
            clearance=dict(getattr(taint, "clearance", None) or {}),
            allow_private_addresses=bool(getattr(taint, "allow_private_addresses", False)),
            allowlist=tuple(getattr(eff, "allowlist", None) or ()),
            network=bool(getattr(eff, "network", True)),
            credentials=creds,
            limits=Limits.from_config(getattr(machine, "broker", None)),
            rules=tuple(_rule_specs(getattr(eff, "rules", None) or ())),
        )


def _rule_specs(rules: Sequence[Any]) -> list[RuleSpec]:
    out = []
    for r in rules:
        decision = str(getattr(r, "decision", "deny"))
        out.append(RuleSpec(
            name=str(getattr(r, "name", "")), when=str(getattr(r, "when", "")),
            decision=decision if decision in ("allow", "ask") else "deny",  # type: ignore[arg-type]
            reason=str(getattr(r, "reason", "")), layer=str(getattr(r, "layer", "machine")),
        ))
    return out


class CompiledPolicy:
    """Everything `gate.decide` needs, precomputed. Build a new one on reload."""

    def __init__(self, settings: PolicySettings, *, home: str, workdir: str) -> None:
        self.settings = settings
        self.permissions: dict[str, Permission] = compile_permissions(settings.permissions)
        # home and workdir are resolved to real paths by the read-path engine.
        # The built-in hidden paths win over every grant, here as in the fence.
        hidden = (*builtin_hidden(), *settings.hidden_paths)
        self.grant: GrantIndex = build_index(
            settings.read_paths, home=home, workdir=workdir, hidden=hidden
        )
        self.workdir = self.grant.workdir
        self.rejected_read_paths = self.grant.grants.rejected
        self.allowlist: Allowlist = compile_allowlist(settings.allowlist)
        self.rules = RuleSet(compile_rules(settings.rules))
        self.clearances: dict[str, Sensitivity | None] = {
            tool: clearance_for(tool, settings.clearance, network=settings.network)
            for tool in TOOLS
        }
