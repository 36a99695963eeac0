"""The policy side of a merged `Effective`: the `PolicySettings` the gate and
the broker compile. Every field is read by name from the typed models, so a
field renamed in the merge or in the settings fails mypy here instead of
falling back to a default (which could be looser)."""

from __future__ import annotations

from leviathd.config.merge import Effective
from leviathd.config.models import Config, TaintPolicy
from leviathd.domain.brokerlimits import Limits
from leviathd.domain.credentials import CredentialSpec
from leviathd.policy.settings import OnExceed, PolicySettings

_ON_EXCEED: dict[TaintPolicy, OnExceed] = {
    TaintPolicy.ALLOW: "allow", TaintPolicy.ASK: "ask", TaintPolicy.DENY: "deny",
}


def policy_settings(eff: Effective, machine: Config | None = None) -> PolicySettings:
    """`machine`: the machine config, to tell its credentials (fetched as root)
    from a user's (fetched as the user), and the source of the broker's limits."""
    machine_creds = machine.credentials if machine is not None else {}
    creds: dict[str, CredentialSpec] = {}
    for name, spec in eff.credentials.items():
        command = tuple(spec.command or ())
        creds[name] = CredentialSpec(
            command, spec.secret_file or "", spec.env or "",
            secret_command=tuple(spec.secret_command or ()),
            from_machine=machine_creds.get(name) == spec,
            workdir=spec.workdir,
            kind=spec.kind, hosts=tuple(spec.hosts), username=spec.username,
            access=tuple(spec.access), allow_http=spec.allow_http,
            wrap=(spec.wrap or command[0].rsplit("/", 1)[-1]) if spec.kind == "cli" else "",
            token_env=spec.token_env or "", known_hosts=tuple(spec.known_hosts),
            header=spec.header, value=spec.value,
            tenant=spec.tenant or "", client_id=spec.client_id or "",
            authority=spec.authority, scope=spec.scope,
        )
    taint = eff.taint
    limits = Limits(**machine.broker.model_dump(exclude_none=True)) if machine else Limits()
    return PolicySettings(
        permissions=dict(eff.permissions),
        read_paths=tuple(eff.read_paths_granted),
        hidden_paths=tuple(eff.hidden_paths),
        taint_enabled=taint.enabled,
        on_exceed=_ON_EXCEED[taint.on_exceed],
        budget=taint.budget,
        approval_timeout=float(taint.approval_timeout),
        clearance=dict(taint.clearance),
        allow_private_addresses=taint.allow_private_addresses,
        allowlist=tuple(eff.allowlist),
        network=bool(eff.network),
        credentials=creds,
        limits=limits,
        rules=tuple(eff.rules),
        tools=dict(eff.tools),
    )
