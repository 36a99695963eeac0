"""The policy-relevant part of an agent's effective settings, compiled once
(per agent, per config reload) into indexes the gate can query quickly."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Literal

from pydantic import TypeAdapter

from leviathd.domain.allowrule import AllowRule
from leviathd.domain.brokerlimits import Limits
from leviathd.domain.credentials import CredentialSpec
from leviathd.domain.permission import Permission
from leviathd.domain.sensitivity import Label, Sensitivity
from leviathd.domain.tools import Registry, ToolKind
from leviathd.hidden import CLI_LOGINS_IN_HOME, builtin_hidden
from leviathd.policy.allowlist import Allowlist, compile_allowlist
from leviathd.policy.labels import clearance_for
from leviathd.policy.permissions import compile_permissions
from leviathd.policy.readgrant import GrantIndex, build_index
from leviathd.policy.rules import RuleSet, RuleSpec, compile_rules
from leviathd.policy.tooldef import ToolDef, with_blueprint_tools

OnExceed = Literal["allow", "deny", "ask"]


@dataclass(frozen=True)
class PolicySettings:
    """Built from the merged settings by `leviathd.config.policy_settings`
    (typed: a field renamed on either side fails mypy there), kept per agent
    as a snapshot written and read by pydantic (`to_snapshot`, `from_snapshot`)."""

    permissions: Mapping[str, Permission] = field(default_factory=dict)
    read_paths: tuple[str, ...] = ()  # active grants: declared and granted
    hidden_paths: tuple[str, ...] = ()
    taint_enabled: bool = True
    on_exceed: OnExceed = "ask"
    budget: int = 32
    approval_timeout: float = 120.0
    clearance: Mapping[str, Label] = field(default_factory=dict)
    allow_private_addresses: bool = False
    allowlist: tuple[AllowRule, ...] = ()
    network: bool = True
    credentials: Mapping[str, CredentialSpec] = field(default_factory=dict)
    # The broker's limits: from the machine config's [broker] only.
    limits: Limits = field(default_factory=Limits)
    # [[rules]] of the machine, then the user, then the blueprint (tighten-only:
    # the merge dropped the lower layers' allow rules).
    rules: tuple[RuleSpec, ...] = ()
    # The blueprint's own tools ([tools.NAME]), run in the agent's fence.
    tools: Mapping[str, ToolDef] = field(default_factory=dict)

    def to_snapshot(self) -> bytes:
        return _SNAPSHOT.dump_json(self)

    @classmethod
    def from_snapshot(cls, data: bytes | str) -> PolicySettings:
        """A snapshot must name every setting (a missing one is not read as
        its default, which may be looser) but those added after snapshots
        were first written; ValueError (pydantic's ValidationError) if not."""
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise ValueError("a policy snapshot is a JSON object")
        missing = _SNAPSHOT_KEYS - raw.keys()
        if missing:
            raise ValueError(f"policy snapshot without {', '.join(sorted(missing))}")
        return _SNAPSHOT.validate_python(raw)


_SNAPSHOT = TypeAdapter(PolicySettings)
# Snapshots written before `limits`, `rules` and `tools` existed take their defaults.
_SNAPSHOT_KEYS = {f.name for f in fields(PolicySettings)} - {"limits", "rules", "tools"}


class CompiledPolicy:
    """Everything `decision.decide` needs, precomputed. Build a new one on reload."""

    def __init__(self, settings: PolicySettings, *, home: str, workdir: str) -> None:
        self.settings = settings
        self.permissions: dict[str, Permission] = compile_permissions(settings.permissions)
        # home and workdir are resolved to real paths by the read-path engine.
        # The built-in hidden paths win over every grant, here as in the fence;
        # so do the agent CLIs' logins, which the fence shows as placeholders
        # but a grant would read in the host's view (broker/tools.py reader).
        hidden = (*builtin_hidden(), *(f"~/{rel}" for rel in CLI_LOGINS_IN_HOME),
                  *settings.hidden_paths)
        self.grant: GrantIndex = build_index(
            settings.read_paths, home=home, workdir=workdir, hidden=hidden
        )
        self.workdir = self.grant.workdir
        self.allowlist: Allowlist = compile_allowlist(settings.allowlist)
        self.rules = RuleSet(compile_rules(settings.rules))
        # The built-in tools and this agent's blueprint's: another agent's
        # gate does not know them (unknown-tool).
        self.registry: Registry = with_blueprint_tools(settings.tools.values())
        self.tools: dict[str, ToolDef] = {
            name: t for name, t in settings.tools.items()
            if self.registry.kind_of(name) is ToolKind.BLUEPRINT
        }
        self.clearances: dict[str, Sensitivity | None] = {
            tool: clearance_for(tool, settings.clearance, network=settings.network,
                                tools=self.registry)
            for tool in self.registry
        }
