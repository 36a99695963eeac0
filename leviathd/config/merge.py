"""Tighten-only merging: the effective settings for one agent and each of its stages.

`resolve` is pure (no I/O, no environment): the machine config sets the ceiling, the
user's config may only tighten it (and may grant read paths for the user's own agents),
and a blueprint may only tighten what the two allow. Every place where a lower layer
asked for something looser and was overruled becomes a `Finding`, which `lev validate`
prints and the daemon logs.

The axes, and which direction is "tighter":

- sandbox kind: none < namespace < container, only up; a blueprint's `engine` is always
  discarded (the engine binary runs on the host, as root, before any prompt); a user's
  too (the engine is the admin's choice);
- `network`: only narrows (true -> "proxy" -> false); `[proxy]`: each layer's
  allow list and ports must all pass, deny lists add up, clearances only lower;
  `default_mounts`: only true -> false;
  `on_unavailable`: only warn -> error; `scratch_dir`: the machine's only;
  `allow_io_uring`: set true by the machine only, turned off by any layer;
- `mounts`: a subset of the upper layer's, each inside one of its mounts with no more
  access. Exception: when no upper layer has a `[sandbox]` section at all, the lower
  layer may opt in with its own `image` and `mounts` (the spec's rule);
- resources: only lower (None, "infinity", is the loosest);
- tool permissions: only stricter, allow < ask < deny; a blueprint may pre-allow
  `web_fetch` only where the user's configs do not set it (the spec's
  `web_search` is not a tool of leviathd);
- taint: enabled only on, on_exceed only stricter, clearances only lower, a larger
  ledger budget and a shorter approval timeout, private addresses only off;
- read paths: a pattern is active only when the blueprint declares it and a config
  grants it (see leviathd/readpatterns.py);
- `[sandbox.containers]`: the machine grants; below it `enabled` only true -> false,
  `cap_add` only a subset, `publish` only any -> loopback, `socket` the machine's only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from leviathd.config.models import (
    Blueprint,
    Config,
    ContainersConfig,
    CredentialConfig,
    FolderGrant,
    OnUnavailable,
    PolicyRule,
    ProxyConfig,
    Publish,
    Resources,
    SandboxConfig,
    TaintConfig,
    TaintPolicy,
)
from leviathd.domain.allowrule import AllowRule
from leviathd.domain.engine import Engine
from leviathd.domain.mounts import Access, MountRequest
from leviathd.domain.permission import Permission
from leviathd.domain.sandbox import SandboxKind
from leviathd.domain.sensitivity import Sensitivity
from leviathd.domain.tools import TOOLS, Registry
from leviathd.policy.rules import RuleSpec
from leviathd.policy.shellrule import ShellPattern
from leviathd.policy.tooldef import ToolDef, make_tool, with_blueprint_tools
from leviathd.readpatterns import ReadPathError, active_patterns, parse_pattern

Level = Literal["error", "warn", "note"]

DEFAULT_KIND = SandboxKind.NAMESPACE
DEFAULT_ENGINE = Engine.AUTO
DEFAULT_ON_UNAVAILABLE = OnUnavailable.ERROR
# The built-in network of a fenced agent (issue 30): its own loopback, out only
# through the daemon's proxy. `true` (the host's network) is an explicit choice.
DEFAULT_NETWORK: Literal["proxy"] = "proxy"
DEFAULT_TAINT_BUDGET = 32
DEFAULT_APPROVAL_TIMEOUT = 120


@dataclass(frozen=True)
class Finding:
    level: Level
    code: str
    message: str
    hint: str = ""


@dataclass(frozen=True)
class TaintSettings:
    enabled: bool = False
    on_exceed: TaintPolicy = TaintPolicy.ASK
    budget: int = DEFAULT_TAINT_BUDGET
    approval_timeout: int = DEFAULT_APPROVAL_TIMEOUT
    clearance: dict[str, Sensitivity] = field(default_factory=dict)
    allow_private_addresses: bool = False


Network = bool | Literal["proxy"]
_NET_RANK: dict[object, int] = {False: 0, "proxy": 1, True: 2}


def net_rank(value: Network) -> int:
    """true > "proxy" > false: a lower layer may only move down."""
    return _NET_RANK[value]


def _net_text(value: Network) -> str:
    return '"proxy"' if value == "proxy" else str(value).lower()


@dataclass(frozen=True)
class ProxyRules:
    """The merged `[proxy]` of every layer (see leviathd/proxy/policy.py).
    `allow`: one tuple per layer that set allow_domains, all must match;
    `ports`: None means the default ports."""

    allow: tuple[tuple[str, ...], ...] = ()
    deny: tuple[str, ...] = ()
    ports: tuple[int, ...] | None = None
    clearance: tuple[tuple[str, Sensitivity], ...] = ()
    max_connections: int | None = None
    # Openings (issue 30): the host's loopback ports and private ranges the
    # proxy may reach. Opened by the configs (open_proxy), narrowed below.
    host_ports: tuple[int, ...] = ()
    private_ranges: tuple[str, ...] = ()
    # Issue 45: the CLIs' logins as placeholders, swapped at the egress. Only
    # the configs turn it off (_config_proxy); a blueprint's setting is ignored.
    cli_logins: bool = True


def open_proxy(rules: ProxyRules, layer: ProxyConfig) -> ProxyRules:
    """The openings of a config layer added to `rules` (the machine's, or a
    user's where the machine left the network open: she could have chosen
    `network = true`, which reaches all of it)."""
    return replace(
        rules,
        host_ports=tuple(sorted({*rules.host_ports, *(layer.host_ports or ())})),
        private_ranges=tuple(dict.fromkeys((*rules.private_ranges,
                                            *(layer.private_ranges or ())))),
    )


def _narrow_openings(rules: ProxyRules, layer: ProxyConfig, where: str,
                     out: _Findings | None) -> ProxyRules:
    """A layer that may not open anything: what it lists narrows the openings
    above it; what it lists beyond them is a finding."""
    host_ports, ranges = rules.host_ports, rules.private_ranges
    if layer.host_ports is not None:
        extra = sorted(set(layer.host_ports) - set(host_ports))
        if extra and out is not None:
            out.add("warn", "proxy-opening-overruled",
                    f"{where} [proxy] host_ports {extra} are ignored: only the machine config "
                    "(or a user's config where the machine sets no network) opens host ports")
        host_ports = tuple(p for p in host_ports if p in layer.host_ports)
    if layer.private_ranges is not None:
        extra_r = [r for r in layer.private_ranges if r not in ranges]
        if extra_r and out is not None:
            out.add("warn", "proxy-opening-overruled",
                    f"{where} [proxy] private_ranges {extra_r} are ignored: only the machine "
                    "config (or a user's config where the machine sets no network) opens them")
        ranges = tuple(r for r in ranges if r in layer.private_ranges)
    return replace(rules, host_ports=host_ports, private_ranges=ranges)


def narrow_proxy(rules: ProxyRules, layer: ProxyConfig, *, where: str = "blueprint",
                 out: _Findings | None = None) -> ProxyRules:
    """`rules` narrowed by one more layer: by construction nothing loosens."""
    clearance = dict(rules.clearance)
    for pattern, sens in layer.clearance.items():
        cur = clearance.get(pattern)
        clearance[pattern] = sens if cur is None or sens.rank < cur.rank else cur
    ports = rules.ports
    if layer.ports is not None:
        mine = tuple(sorted(set(layer.ports)))
        ports = mine if ports is None else tuple(p for p in ports if p in mine)
    cap = rules.max_connections
    if layer.max_connections is not None:
        cap = layer.max_connections if cap is None else min(cap, layer.max_connections)
    narrowed = ProxyRules(
        allow=rules.allow + ((tuple(layer.allow_domains),) if layer.allow_domains is not None
                             else ()),
        deny=tuple(dict.fromkeys((*rules.deny, *layer.deny_domains))),
        ports=ports,
        clearance=tuple(sorted(clearance.items())),
        max_connections=cap,
        host_ports=rules.host_ports,
        private_ranges=rules.private_ranges,
        # A config (machine, user) turns it off; a blueprint cannot.
        cli_logins=rules.cli_logins and (where == "blueprint" or layer.cli_logins is not False),
    )
    if layer.cli_logins is not None and where == "blueprint" and out is not None:
        out.add("warn", "proxy-cli-logins-ignored",
                "blueprint [proxy] cli_logins is ignored: only the machine or user config "
                "turns the CLI logins' placeholders off")
    return _narrow_openings(narrowed, layer, where, out)


UPLOAD_MAX_DEFAULT = 4 << 30  # [sandbox.containers] upload_max unset: 4 GiB
# [sandbox.containers] image_store_max unset: 2 GiB (each agent's start copies the store)
IMAGE_STORE_MAX_DEFAULT = 2 << 30


@dataclass(frozen=True)
class ContainerSettings:
    """The agent's filtered container-engine socket (leviathd/enginesock).
    `host_root` false (the default): the agent's user's own rootless podman.
    True: an engine that is root on the host, `socket` or (None) the daemon's
    own rootful podman API service."""

    enabled: bool = False
    cap_add: tuple[str, ...] = ()
    publish: Publish = Publish.LOOPBACK
    socket: str | None = None
    host_root: bool = False
    upload_max: int = UPLOAD_MAX_DEFAULT
    image_store_max: int = IMAGE_STORE_MAX_DEFAULT


@dataclass(frozen=True)
class Effective:
    """What one agent (or one stage) actually gets. `scratch_dir` None means the default
    under the state directory; `resources` None fields mean no limit; `permissions`
    lists only tools somebody configured (the policy's default applies to the rest)."""

    kind: SandboxKind = DEFAULT_KIND
    engine: Engine = DEFAULT_ENGINE
    image: str | None = None
    network: Network = DEFAULT_NETWORK
    mounts: list[MountRequest] = field(default_factory=list)
    default_mounts: bool = True
    on_unavailable: OnUnavailable = DEFAULT_ON_UNAVAILABLE
    scratch_dir: str | None = None
    scratch_size: int | None = None
    scratch_user_max: str = "50%"
    allow_io_uring: bool = False
    resources: Resources = field(default_factory=Resources)
    permissions: dict[str, Permission] = field(default_factory=dict)
    read_paths_declared: list[str] = field(default_factory=list)
    read_paths_granted: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    env_pass: list[str] = field(default_factory=list)
    env_withhold: list[str] = field(default_factory=list)
    hidden_paths: list[str] = field(default_factory=list)
    protected_paths: list[str] = field(default_factory=list)
    hook_files_writable: list[str] = field(default_factory=list)
    taint: TaintSettings = field(default_factory=TaintSettings)
    allowlist: list[AllowRule] = field(default_factory=list)
    rules: list[RuleSpec] = field(default_factory=list)
    credentials: dict[str, CredentialConfig] = field(default_factory=dict)
    # The blueprint's [tools.NAME], checked (policy/tooldef.py); every stage has them.
    tools: dict[str, ToolDef] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    proxy: ProxyRules = field(default_factory=ProxyRules)
    containers: ContainerSettings = field(default_factory=ContainerSettings)
    # True when the image and mounts came from the blueprint's own opt-in (no [sandbox]
    # in any config); shown by `lev validate` and `lev inspect`.
    blueprint_sandbox: bool = False
    # [[folders]] of the machine and user configs for this agent (or for any
    # agent in a repository): the spec keeps those whose repository holds the
    # workdir.
    folders: list[FolderGrant] = field(default_factory=list)


@dataclass(frozen=True)
class MergeResult:
    agent: Effective
    stages: dict[str, Effective]
    seed: list[list[str]]
    findings: list[Finding]


class _Findings:
    def __init__(self) -> None:
        self.items: list[Finding] = []
        self._seen: set[tuple[str, str]] = set()

    def add(self, level: Level, code: str, message: str, hint: str = "") -> None:
        if (code, message) in self._seen:
            return
        self._seen.add((code, message))
        self.items.append(Finding(level, code, message, hint))


# ---------------------------------------------------------------------- helpers


def _inside(path: str, base: str) -> bool:
    base = base.rstrip("/") or "/"
    path = path.rstrip("/") or "/"
    if base == "/":
        return path.startswith("/")
    return path == base or path.startswith(base + "/")


def _narrow_mounts(
    wanted: list[MountRequest], allowed: list[MountRequest], where: str, out: _Findings
) -> list[MountRequest]:
    """Keep each wanted mount that lies inside an allowed one, with no more access."""
    kept: list[MountRequest] = []
    for m in wanted:
        covering = [a for a in allowed if _inside(m.path, a.path)]
        if not covering:
            out.add(
                "warn",
                "mount-overruled",
                f"{where}.mounts: {m.path} ({m.access}) is not among the mounts your "
                "config allows; it is left out",
            )
            continue
        best = max(a.access.rank for a in covering)
        if m.access.rank > best:
            out.add(
                "warn",
                "mount-access-overruled",
                f"{where}.mounts: {m.path} asks for write access; your config allows read "
                "only, so it is mounted read-only",
            )
            m = MountRequest(path=m.path, access=Access.READ)
        kept.append(m)
    return kept


def _min_limit(upper: int | None, lower: int | None) -> int | None:
    if upper is None:
        return lower
    if lower is None:
        return upper
    return min(upper, lower)


_RESOURCE_FIELDS = ("memory_max", "tasks_max", "cpu_quota", "cpu_weight")


def _tighten_resources(upper: Resources, lower: Resources, where: str, out: _Findings) -> Resources:
    values: dict[str, int | None] = {}
    for name in _RESOURCE_FIELDS:
        u, lo = getattr(upper, name), getattr(lower, name)
        values[name] = _min_limit(u, lo)
        if u is not None and lo is not None and lo > u:
            out.add(
                "warn",
                "resource-overruled",
                f"{where}.resources.{name} = {lo} is above the limit of {u} set above it; "
                f"{u} applies",
            )
    return Resources(**values)


def _narrow_io_uring(upper: bool, asked: bool, where: str, out: _Findings) -> bool:
    if asked and not upper:
        out.add(
            "warn",
            "io-uring-ignored",
            f"{where} allow_io_uring = true is ignored: only the machine config allows io_uring",
        )
        return False
    return asked


def _default_clearance(tool: str) -> Sensitivity | None:
    found = TOOLS.get(tool)
    return found.clearance if found is not None else None


def _check_credential_store(value: str | None, where: str, out: _Findings) -> None:
    # Parsed so that old files load; nothing ever read it (issue 21 §8).
    if value is not None:
        out.add("warn", "credential-store-ignored",
                f"{where}: credential_store is not a setting of leviathd and is ignored; "
                "secrets come from each [credentials.NAME] secret_file or secret_command")


def _check_rules(rules: Iterable[AllowRule], where: str, out: _Findings) -> None:
    """What the allowlist will make of each rule, said where the rule is."""
    for rule in rules:
        if rule.tool == "*":
            out.add("warn", "allowlist-star",
                    f"{where}: tool = '*' is not a tool: this rule matches nothing; "
                    "write one rule per tool")
        elif rule.tool == "shell":
            try:
                ShellPattern(rule.target)
            except ValueError as exc:
                out.add("warn", "allowlist-shell", f"{where}: {exc}; this rule matches nothing")


def _layer_rules(rules: Iterable[PolicyRule], layer: str, where: str,
                 out: _Findings) -> list[RuleSpec]:
    """Tighten-only: a user's or a blueprint's rule may ask or deny, never allow."""
    kept = []
    for rule in rules:
        if rule.decision == "allow" and layer != "machine":
            out.add("warn", "rule-overruled",
                    f"{where} {rule.name!r}: decision = \"allow\" is ignored: only the machine "
                    "config's rules may allow; a user's or a blueprint's may ask or deny")
            continue
        kept.append(RuleSpec(rule.name, rule.when, rule.decision, rule.reason, layer))
    return kept


def _tighten_containers(
    upper: ContainerSettings, lower: ContainersConfig | None, where: str, out: _Findings
) -> ContainerSettings:
    """A lower layer may ask for the filtered engine socket, never grant it."""
    if lower is None:
        return upper
    got = upper
    if lower.enabled is not None:
        if lower.enabled and not upper.enabled:
            out.add(
                "warn",
                "containers-not-granted",
                f"{where} [sandbox.containers] enabled = true is overruled: only the machine "
                "config turns the filtered container socket on",
            )
        else:
            got = replace(got, enabled=lower.enabled)
    if lower.cap_add is not None:
        extra = [c for c in lower.cap_add if c not in upper.cap_add]
        if extra:
            out.add(
                "warn",
                "containers-cap-add-overruled",
                f"{where} [sandbox.containers] cap_add {', '.join(extra)} is overruled: not "
                "in the machine's cap_add",
            )
        got = replace(got, cap_add=tuple(c for c in lower.cap_add if c in upper.cap_add))
    if lower.publish is not None:
        if lower.publish.rank > upper.publish.rank:
            out.add(
                "warn",
                "containers-publish-overruled",
                f"{where} [sandbox.containers] publish = 'any' is overruled: published ports "
                "bind 127.0.0.1",
            )
        else:
            got = replace(got, publish=lower.publish)
    if lower.host_root_engine is not None:
        out.add(
            "warn",
            "containers-host-root-ignored",
            f"{where} [sandbox.containers] host_root_engine is ignored: only the machine "
            "config chooses an engine that is root on the host",
        )
    if lower.upload_max is not None:
        if lower.upload_max > upper.upload_max:
            out.add(
                "warn",
                "containers-upload-max-overruled",
                f"{where} [sandbox.containers] upload_max is overruled: over the machine's "
                f"{upper.upload_max} bytes",
            )
        else:
            got = replace(got, upload_max=lower.upload_max)
    if lower.image_store_max is not None:
        if lower.image_store_max > upper.image_store_max:
            out.add(
                "warn",
                "containers-image-store-max-overruled",
                f"{where} [sandbox.containers] image_store_max is overruled: over the "
                f"machine's {upper.image_store_max} bytes",
            )
        else:
            got = replace(got, image_store_max=lower.image_store_max)
    if lower.socket is not None:
        out.add(
            "warn",
            "containers-socket-ignored",
            f"{where} [sandbox.containers] socket is ignored: only the machine config names "
            "the engine",
        )
    return got


def _check_tools(
    names: Iterable[str], where: str, out: _Findings, known: Registry = TOOLS
) -> None:
    """`known`: the built-in tools and the blueprint's own ([tools.NAME])."""
    for name in names:
        if known.find(name) is None:
            out.add(
                "warn",
                "unknown-tool",
                f"{where}: unknown tool {name!r}; known tools: {', '.join(known.names)}",
            )


def _check_patterns(patterns: Iterable[str], where: str, out: _Findings) -> None:
    for text in patterns:
        try:
            p = parse_pattern(text)
        except ReadPathError as exc:
            out.add("error", "bad-read-path", f"{where}: {exc}")
            continue
        if p.windows:
            out.add(
                "warn",
                "bad-read-path",
                f"{where}: {text!r} names a drive letter and never matches on Linux",
            )


# ------------------------------------------------------- the configs' own layer


@dataclass
class _Base:
    """The configs merged (machine, then user) for one agent: the ceiling a blueprint
    may tighten."""

    eff: Effective
    has_sandbox: bool  # any config has a [sandbox] section
    configured_tools: set[str]
    grants: list[str]
    agent_grants: list[str]
    allow_all: bool
    # No config set `network`: the built-in default ("proxy", or true for
    # kind = "none", which has no proxy) applies.
    network_defaulted: bool = False


def _perm_table(cfg: Config, agent: str) -> dict[str, Permission]:
    table = dict(cfg.tool_permissions)
    table.update(cfg.agent_tool_permissions.get(agent, {}))
    return table


@dataclass(frozen=True)
class _Layer:
    """How a finding names the layer above the one that asked too much."""

    upper: str  # "the machine config"
    upper_s: str  # "the machine's"
    verb: str  # what became of the setting: "ignored", "overruled"
    hints: bool  # whether the axes' hints are shown (to a blueprint's reader)


_BELOW_MACHINE = _Layer("the machine config", "the machine's", "ignored", hints=False)
_BELOW_CONFIGS = _Layer("your config", "your config's", "overruled", hints=True)


@dataclass(frozen=True)
class _Axis:
    """A `[sandbox]` setting a lower layer may only tighten: `looser(asked,
    upper)` says when it asked for more, `text` what the finding says then."""

    name: str
    code: str
    looser: Callable[[Any, Any], bool]
    text: Callable[[Any, Any, _Layer], str]
    hint: str = ""


# The ordered axes, in the order their findings are made.
_AXES: tuple[_Axis, ...] = (
    _Axis("kind", "sandbox-kind-overruled", lambda a, u: a.rank < u.rank,
          lambda a, u, layer: f"kind = {a.value!r} is looser than {layer.upper_s} "
                              f"{u.value!r}; {u.value!r} applies",
          "a blueprint may choose a stricter sandbox, never a looser one"),
    _Axis("network", "network-overruled", lambda a, u: net_rank(a) > net_rank(u),
          lambda a, u, layer: f"network = {_net_text(a)} is {layer.verb}: {layer.upper} "
                              f"sets network = {_net_text(u)}"),
    _Axis("default_mounts", "default-mounts-overruled", lambda a, u: bool(a and not u),
          lambda a, u, layer: f"default_mounts = true is {layer.verb}: {layer.upper} "
                              "turns them off"),
    _Axis("on_unavailable", "on-unavailable-overruled", lambda a, u: a.rank < u.rank,
          lambda a, u, layer: f"on_unavailable = 'warn' is {layer.verb}: {layer.upper} "
                              "refuses to run unfenced ('error')"),
)  # fmt: skip


def _narrow_axes(
    names: tuple[str, ...], asked: SandboxConfig, upper: Mapping[str, object], layer: _Layer,
    where: Callable[[str], str], out: _Findings,
) -> dict[str, object]:
    """The axes `names` of `asked` that do not loosen `upper`; a finding for each that does."""
    got: dict[str, object] = {}
    for axis in _AXES:
        value = getattr(asked, axis.name) if axis.name in names else None
        if value is None:
            continue
        current = upper[axis.name]
        if axis.looser(value, current):
            out.add("warn", axis.code, f"{where(axis.name)} {axis.text(value, current, layer)}",
                    axis.hint if layer.hints else "")
        else:
            got[axis.name] = value
    return got


def _tighten_taint(
    taint: TaintSettings, ut: TaintConfig, w: str, out: _Findings, known: Registry = TOOLS
) -> TaintSettings:
    """The machine's `[taint]`, tightened by the user's: enabled only on,
    on_exceed only stricter, clearances only lower, a larger ledger budget and
    a shorter approval timeout, private addresses only off."""
    on_exceed = taint.on_exceed
    if ut.on_exceed is not None:
        if ut.on_exceed.rank < on_exceed.rank:
            out.add(
                "warn",
                "taint-overruled",
                f"{w} [taint] on_exceed = {ut.on_exceed.value!r} is looser than the "
                f"machine's {on_exceed.value!r}; {on_exceed.value!r} applies",
            )
        else:
            on_exceed = ut.on_exceed
    clearance = dict(taint.clearance)
    for tool, sens in ut.clearance.items():
        # Against the machine's effective value: its own setting, or the
        # built-in default it relies on (issue 21 §7).
        cur = clearance.get(tool)
        if cur is None:  # (not `or`: Public is 0)
            cur = _default_clearance(tool)
        if cur is not None and sens.rank > cur.rank:
            out.add(
                "warn",
                "taint-overruled",
                f"{w} [taint.clearance] {tool} = {str(sens)!r} is above the machine's "
                f"{str(cur)!r}; {str(cur)!r} applies",
            )
        else:
            clearance[tool] = sens
    _check_tools(ut.clearance, f"{w} [taint.clearance]", out, known)
    budget = taint.budget
    if ut.budget is not None:
        if ut.budget < budget:
            out.add(
                "warn",
                "taint-overruled",
                f"{w} [taint] budget = {ut.budget} is below the machine's {budget}; "
                "a smaller ledger forgets taint sooner, so the machine's applies",
            )
        else:
            budget = ut.budget
    timeout = taint.approval_timeout
    if ut.approval_timeout is not None:
        if ut.approval_timeout > timeout:
            out.add(
                "warn",
                "taint-overruled",
                f"{w} [taint] approval_timeout = {ut.approval_timeout} is above the "
                f"machine's {timeout}; the machine's applies",
            )
        else:
            timeout = ut.approval_timeout
    private = taint.allow_private_addresses
    if ut.allow_private_addresses is not None:
        if ut.allow_private_addresses and not private:
            # Loopback and private addresses reach other users' services and the
            # cloud metadata endpoint: only the machine may open them.
            out.add(
                "warn",
                "taint-overruled",
                f"{w} [taint] allow_private_addresses = true is ignored: only the "
                "machine config may allow private addresses",
            )
        else:
            private = ut.allow_private_addresses
    taint = TaintSettings(
        enabled=taint.enabled or bool(ut.enabled),
        on_exceed=on_exceed,
        budget=budget,
        approval_timeout=timeout,
        clearance=clearance,
        allow_private_addresses=private,
    )
    if ut.enabled is False and taint.enabled:
        out.add(
            "warn",
            "taint-overruled",
            f"{w} [taint] enabled = false is ignored: the machine config turns it on",
        )
    return taint


def _config_layer(
    machine: Config, user: Config | None, agent: str, out: _Findings,
    known: Registry = TOOLS,
) -> _Base:
    ms = machine.sandbox or SandboxConfig()
    kind = ms.kind or DEFAULT_KIND
    engine = ms.engine or DEFAULT_ENGINE
    image = ms.image
    # Unset on the machine: the ceiling stays the host's network (a user may
    # choose `true` for her agents), the default is the proxy.
    ceiling: Network = True if ms.network is None else ms.network
    network: Network = DEFAULT_NETWORK if ms.network is None else ms.network
    network_defaulted = ms.network is None
    mounts = list(ms.mounts or [])
    protected_paths = list(ms.protected_paths or [])
    hook_files_writable = list(ms.hook_files_writable or [])
    default_mounts = True if ms.default_mounts is None else ms.default_mounts
    on_unavailable = ms.on_unavailable or DEFAULT_ON_UNAVAILABLE
    allow_io_uring = bool(ms.allow_io_uring)
    resources = machine.resources
    perms = _perm_table(machine, agent)
    configured_tools = set(perms)
    mt = machine.taint
    taint = TaintSettings(
        enabled=bool(mt.enabled),
        on_exceed=mt.on_exceed or TaintPolicy.ASK,
        budget=mt.budget or DEFAULT_TAINT_BUDGET,
        approval_timeout=mt.approval_timeout or DEFAULT_APPROVAL_TIMEOUT,
        clearance=dict(mt.clearance),
        allow_private_addresses=bool(mt.allow_private_addresses),
    )
    sec = machine.security
    grants = list(sec.read_paths)
    agent_grants: list[str] = []
    if agent in machine.agent_read_paths:
        agent_grants = list(machine.agent_read_paths[agent].allow)
    allow_all = bool(sec.allow_blueprint_read_paths)
    hidden = list(sec.hidden_paths)
    env_pass = list(sec.env_pass)
    env_withhold = list(sec.env_withhold)
    credentials = dict(machine.credentials)
    allowlist = list(machine.allowlist)
    rules = _layer_rules(machine.rules, "machine", "machine config [[rules]]", out)
    _check_credential_store(sec.credential_store, "machine config [security]", out)
    proxy = _config_proxy(ProxyRules(), machine.proxy)
    if user is not None:
        if ceiling is True:
            proxy = _config_proxy(proxy, user.proxy)
        else:
            proxy = narrow_proxy(proxy, user.proxy, where="user config", out=out)

    _check_tools(machine.tool_permissions, "machine config [tool_permissions]", out, known)
    for name, table in machine.agent_tool_permissions.items():
        _check_tools(table, f"machine config [agent_tool_permissions.{name}]", out, known)
    _check_tools(mt.clearance, "machine config [taint.clearance]", out, known)
    _check_tools((r.tool for r in machine.allowlist if r.tool != "*"),
                 "machine config [[allowlist]]", out, known)
    _check_rules(machine.allowlist, "machine config [[allowlist]]", out)

    if user is not None:
        w = "user config"
        us = user.sandbox or SandboxConfig()
        kind = _narrow_axes(("kind",), us, {"kind": kind}, _BELOW_MACHINE,  # type: ignore[assignment]
                            lambda _n: f"{w} [sandbox]", out).get("kind", kind)
        if us.engine is not None and us.engine != engine:
            out.add(
                "warn",
                "engine-discarded",
                f"{w} [sandbox] engine = {us.engine.value!r} is ignored: the container "
                f"engine is the machine's choice ({engine.value!r})",
            )
        if machine.sandbox is None:
            # No [sandbox] on the machine: the user may opt in with an image and mounts.
            image = us.image if us.image is not None else image
            mounts = list(us.mounts) if us.mounts is not None else mounts
        else:
            if us.image is not None and us.image != image:
                out.add(
                    "warn",
                    "image-discarded",
                    f"{w} [sandbox] image = {us.image!r} is ignored: the machine config "
                    "has a [sandbox] of its own",
                )
            if us.mounts is not None:
                mounts = _narrow_mounts(list(us.mounts), mounts, f"{w} [sandbox]", out)
        narrowed = _narrow_axes(
            ("network", "default_mounts", "on_unavailable"), us,
            {"network": ceiling, "default_mounts": default_mounts,
             "on_unavailable": on_unavailable},
            _BELOW_MACHINE, lambda _n: f"{w} [sandbox]", out,
        )
        if "network" in narrowed:
            network = narrowed["network"]  # type: ignore[assignment]
            network_defaulted = False
        default_mounts = bool(narrowed.get("default_mounts", default_mounts))
        on_unavailable = narrowed.get("on_unavailable", on_unavailable)  # type: ignore[assignment]
        if us.scratch_dir is not None or us.scratch_size is not None \
                or us.scratch_user_max is not None:  # fmt: skip
            out.add(
                "warn",
                "scratch-dir-ignored",
                f"{w} [sandbox] scratch_dir, scratch_size and scratch_user_max are ignored: "
                "only the machine "
                "config sets them",
            )
        if us.allow_io_uring is not None:
            allow_io_uring = _narrow_io_uring(
                allow_io_uring, us.allow_io_uring, f"{w} [sandbox]", out
            )
        resources = _tighten_resources(resources, user.resources, w, out)
        # More protected paths only take rights away: any layer may add some.
        protected_paths += [p for p in us.protected_paths or [] if p not in protected_paths]
        # The user's own repositories: she may give their hook files to her agents.
        hook_files_writable += [p for p in us.hook_files_writable or []
                                if p not in hook_files_writable]

        uperms = _perm_table(user, agent)
        for tool, level in uperms.items():
            current = perms.get(tool)
            if current is not None and level.rank < current.rank:
                out.add(
                    "warn",
                    "permission-overruled",
                    f"{w}: {tool} = {level.value!r} is looser than the machine's "
                    f"{current.value!r}; {current.value!r} applies",
                )
            else:
                perms[tool] = level
        configured_tools |= set(uperms)
        _check_tools(user.tool_permissions, f"{w} [tool_permissions]", out, known)
        for name, table in user.agent_tool_permissions.items():
            _check_tools(table, f"{w} [agent_tool_permissions.{name}]", out, known)

        taint = _tighten_taint(taint, user.taint, w, out, known)
        allowlist += list(user.allowlist)
        rules += _layer_rules(user.rules, "user", f"{w} [[rules]]", out)
        _check_tools((r.tool for r in user.allowlist if r.tool != "*"), f"{w} [[allowlist]]",
                     out, known)
        _check_rules(user.allowlist, f"{w} [[allowlist]]", out)

        usec = user.security
        grants += list(usec.read_paths)
        if agent in user.agent_read_paths:
            agent_grants += list(user.agent_read_paths[agent].allow)
        allow_all = allow_all or bool(usec.allow_blueprint_read_paths)
        hidden += [h for h in usec.hidden_paths if h not in hidden]
        env_pass += [e for e in usec.env_pass if e not in env_pass]
        env_withhold += [e for e in usec.env_withhold if e not in env_withhold]
        _check_credential_store(usec.credential_store, f"{w} [security]", out)
        for name, cred in user.credentials.items():
            if name in credentials:
                out.add(
                    "warn",
                    "credential-overruled",
                    f"{w} [credentials.{name}] is ignored: the machine config defines "
                    f"a credential named {name!r}",
                )
            else:
                credentials[name] = cred

    # A name the machine or the user withholds is never passed.
    env_pass = [e for e in env_pass if e not in env_withhold]
    mc = ms.containers or ContainersConfig()
    host_root = bool(mc.host_root_engine)
    if mc.socket is not None and not host_root:
        out.add(
            "warn",
            "containers-socket-needs-host-root",
            "machine config [sandbox.containers] socket is ignored without host_root_engine "
            "= true (an engine on a socket of its own is taken as root on the host): agents "
            "get their users' own rootless podman",
        )
    containers = ContainerSettings(
        enabled=bool(mc.enabled),
        cap_add=tuple(dict.fromkeys(mc.cap_add or ())),
        publish=mc.publish or Publish.LOOPBACK,
        socket=mc.socket if host_root else None,
        host_root=host_root,
        upload_max=UPLOAD_MAX_DEFAULT if mc.upload_max is None else mc.upload_max,
        image_store_max=(IMAGE_STORE_MAX_DEFAULT if mc.image_store_max is None
                         else mc.image_store_max),
    )
    if user is not None and user.sandbox is not None:
        containers = _tighten_containers(containers, user.sandbox.containers, "user config", out)
    eff = Effective(
        containers=containers,
        kind=kind,
        engine=engine,
        image=image,
        network=network,
        mounts=mounts,
        default_mounts=default_mounts,
        on_unavailable=on_unavailable,
        scratch_dir=ms.scratch_dir,
        scratch_size=ms.scratch_size,
        scratch_user_max=ms.scratch_user_max or "50%",
        allow_io_uring=allow_io_uring,
        resources=resources,
        permissions=perms,
        env_pass=env_pass,
        env_withhold=env_withhold,
        hidden_paths=hidden,
        protected_paths=protected_paths,
        hook_files_writable=hook_files_writable,
        taint=taint,
        allowlist=allowlist,
        rules=rules,
        credentials=credentials,
        proxy=proxy,
        folders=[f for f in [*machine.folders, *(user.folders if user is not None else [])]
                 if f.agent is None or f.agent == agent],
    )
    return _Base(
        eff=eff,
        has_sandbox=machine.sandbox is not None or (user is not None and user.sandbox is not None),
        configured_tools=configured_tools,
        grants=grants,
        agent_grants=agent_grants,
        allow_all=allow_all,
        network_defaulted=network_defaulted,
    )


def _config_proxy(rules: ProxyRules, layer: ProxyConfig) -> ProxyRules:
    """A config layer's `[proxy]`: its lists narrow, its openings open."""
    shut = layer.model_copy(update={"host_ports": None, "private_ranges": None})
    return open_proxy(narrow_proxy(rules, shut, where="config"), layer)


def default_network(eff: Effective) -> Effective:
    """The built-in network for the sandbox kind: kind = "none" has no proxy
    (it keeps the host's network), every fence gets the proxy."""
    return replace(eff, network=True) if eff.kind == SandboxKind.NONE else eff


# ----------------------------------------------------------- the blueprint layer


def _overlay(
    top: SandboxConfig | None, stage: SandboxConfig | None, stage_where: str
) -> tuple[SandboxConfig, dict[str, str]]:
    """A stage's sandbox: its own fields over the blueprint's, with where each came from."""
    values: dict[str, object] = {}
    origin: dict[str, str] = {}
    for name in SandboxConfig.model_fields:
        s = getattr(stage, name) if stage is not None else None
        t = getattr(top, name) if top is not None else None
        if s is not None:
            values[name], origin[name] = s, stage_where
        elif t is not None:
            values[name], origin[name] = t, "blueprint [sandbox]"
    return SandboxConfig.model_validate(values), origin


def _apply_sandbox(
    base: _Base, sb: SandboxConfig, origin: Mapping[str, str], out: _Findings
) -> Effective:
    """The configs' effective sandbox, tightened by what the blueprint (or stage) asks."""
    e = base.eff
    got: dict[str, object] = {}

    def where(name: str) -> str:
        return origin.get(name, "blueprint [sandbox]")

    upper = {"kind": e.kind, "network": e.network, "default_mounts": e.default_mounts,
             "on_unavailable": e.on_unavailable}
    if base.network_defaulted and sb.network is True:
        out.add("warn", "network-overruled",
                f"{where('network')} network = true is overruled: the built-in default is "
                'network = "proxy"', "a [sandbox] network = true in your config.toml allows it")
        sb = sb.model_copy(update={"network": None})
    got.update(_narrow_axes(("kind",), sb, upper, _BELOW_CONFIGS, where, out))
    if sb.engine is not None:
        out.add(
            "warn",
            "engine-discarded",
            f"{where('engine')} engine = {sb.engine.value!r} is discarded: the engine runs "
            f"on the host before any prompt, so only your config chooses it "
            f"({e.engine.value!r})",
        )
    opt_in = not base.has_sandbox
    if sb.image is not None:
        if opt_in:
            got["image"] = sb.image
        elif sb.image != e.image:
            out.add(
                "warn",
                "image-discarded",
                f"{where('image')} image = {sb.image!r} is discarded: your config has a "
                "[sandbox] of its own",
            )
    if sb.mounts is not None:
        if opt_in:
            # A blueprint's own mounts are read-only: the least trusted layer
            # never makes a host folder writable (~/.local/bin, ~/.config with
            # systemd/user and autostart: what the host runs next). Only your
            # config gives write access.
            got["mounts"] = [m if m.access is Access.READ else
                             m.model_copy(update={"access": Access.READ}) for m in sb.mounts]
            written = [m.path for m in sb.mounts if m.access is not Access.READ]
            if written:
                out.add(
                    "warn",
                    "blueprint-mounts-read-only",
                    f"{where('mounts')} asks to write in {', '.join(written)}: a blueprint's "
                    "own mounts are read-only",
                    "a mounts entry with access = \"write\" in your config.toml gives it",
                )
            if sb.mounts:
                listed = ", ".join(f"{m.path} ({m.access.value})" for m in sb.mounts)
                out.add(
                    "note",
                    "blueprint-mounts",
                    f"{where('mounts')} mounts its own folders, because your config has "
                    f"no [sandbox]: {listed}",
                    "read them before you run it; a [sandbox] in your config.toml "
                    "takes this choice back",
                )
        else:
            got["mounts"] = _narrow_mounts(list(sb.mounts), e.mounts, where("mounts"), out)
    got.update(_narrow_axes(("network", "default_mounts", "on_unavailable"), sb, upper,
                            _BELOW_CONFIGS, where, out))
    if sb.scratch_dir is not None or sb.scratch_size is not None \
            or sb.scratch_user_max is not None:  # fmt: skip
        out.add(
            "warn",
            "scratch-dir-ignored",
            f"{where('scratch_dir')} scratch_dir and scratch_size are ignored: only the "
            "machine config sets them",
        )
    if sb.allow_io_uring is not None:
        allowed = _narrow_io_uring(e.allow_io_uring, sb.allow_io_uring, where("allow_io_uring"),
                                   out)  # fmt: skip
        if allowed != e.allow_io_uring:
            got["allow_io_uring"] = allowed
    if sb.containers is not None:
        got["containers"] = _tighten_containers(
            e.containers, sb.containers, where("containers"), out
        )
    if sb.hook_files_writable:
        out.add(
            "warn",
            "hook-files-ignored",
            f"{where('hook_files_writable')} hook_files_writable is ignored: only the machine "
            "and user configs give hook files to agents",
        )
    if sb.protected_paths:
        got["protected_paths"] = e.protected_paths + [
            p for p in sb.protected_paths if p not in e.protected_paths
        ]
    if opt_in and ("image" in got or "mounts" in got):
        got["blueprint_sandbox"] = True
    fenced = replace(e, **got)  # type: ignore[arg-type]
    if base.network_defaulted and "network" not in got:
        fenced = default_network(fenced)
    return fenced


def _apply_permissions(
    base: _Base, asked: Mapping[str, Permission], out: _Findings
) -> dict[str, Permission]:
    perms = dict(base.eff.permissions)
    pre_allowable = {t.name for t in TOOLS.values() if t.pre_allowable}
    web_configured = bool(base.configured_tools & pre_allowable)
    for tool, level in asked.items():
        current = perms.get(tool)
        if current is not None:
            if level.rank < current.rank:
                out.add(
                    "warn",
                    "permission-overruled",
                    f"blueprint [permissions] {tool} = {level.value!r} is looser than your "
                    f"config's {current.value!r}; {current.value!r} applies",
                )
            else:
                perms[tool] = level
            continue
        if level is not Permission.ALLOW:
            perms[tool] = level
        elif tool in pre_allowable and not web_configured:
            perms[tool] = level  # the spec's one exception: a pre-allowed web tool
        elif tool in pre_allowable:
            out.add(
                "warn",
                "permission-overruled",
                f"blueprint [permissions] {tool} = 'allow' is not applied: your config "
                "sets web_fetch, so your setting governs it",
                f'add {tool} = "allow" to [tool_permissions] to allow it',
            )
        else:
            out.add(
                "note",
                "permission-not-applied",
                f"blueprint [permissions] {tool} = 'allow' is not applied: a blueprint "
                "may only tighten permissions (pre-allowing only web_fetch); "
                f"{tool} follows your config",
            )
    return perms


def _toml_list(items: Iterable[str]) -> str:
    return (
        "["
        + ", ".join('"' + i.replace("\\", "\\\\").replace('"', '\\"') + '"' for i in items)
        + "]"
    )


def _read_path_findings(name: str, declared: list[str], granted: list[str], out: _Findings) -> None:
    if not declared:
        return
    missing = [d for d in declared if d not in granted]
    if missing:
        out.add(
            "warn",
            "read-paths-not-granted",
            f"your config does not grant {', '.join(missing)}: reads matching them will be refused",
            f"add to your config.toml: [agent_read_paths.{name}] allow = {_toml_list(missing)}",
        )
    states = "; ".join(f"{d}: {'granted' if d in granted else 'NOT granted'}" for d in declared)
    out.add(
        "note",
        "read-paths-declared",
        f"declares [read_paths] (reads outside the run workdir): {len(declared)} declared, "
        f"{len(granted)} granted",
        states,
    )


def tools_of(blueprint: Blueprint) -> dict[str, ToolDef]:
    """The blueprint's tools as the broker takes them (the model checked them)."""
    return {
        name: make_tool(name, description=t.description, schema=t.arguments, argv=t.argv,
                        output=str(t.output), sends_data=t.sends_data, timeout=t.timeout)
        for name, t in blueprint.tools.items()
    }


def resolve(
    machine: Config, user: Config | None, blueprint: Blueprint | None, agent_name: str
) -> MergeResult:
    """The effective settings for `agent_name` run by the owner of `user` (None: no user
    config), from `blueprint` (None: the configs alone). Pure; never raises for content
    the models accepted."""
    out = _Findings()
    own = tools_of(blueprint) if blueprint is not None else {}
    known = with_blueprint_tools(own.values())
    base = _config_layer(machine, user, agent_name, out, known)
    _check_patterns(base.grants, "config [security] read_paths", out)
    _check_patterns(base.agent_grants, f"config [agent_read_paths.{agent_name}]", out)
    if blueprint is None:
        eff = default_network(base.eff) if base.network_defaulted else base.eff
        return MergeResult(agent=eff, stages={}, seed=[], findings=out.items)

    declared_raw = list(blueprint.read_paths.allow)
    _check_patterns(declared_raw, "blueprint [read_paths] allow", out)
    declared = active_patterns(declared_raw, declared_raw, allow_all=True)  # valid, deduped
    granted = active_patterns(declared, base.grants + base.agent_grants, allow_all=base.allow_all)
    _check_tools(blueprint.permissions, "blueprint [permissions]", out, known)
    permissions = _apply_permissions(base, blueprint.permissions, out)
    proxy = narrow_proxy(base.eff.proxy, blueprint.proxy, where="blueprint", out=out)
    resources = _tighten_resources(base.eff.resources, blueprint.resources, "blueprint", out)
    blueprint_rules = _layer_rules(blueprint.rules, "blueprint", "blueprint [[rules]]", out)

    def effective(
        sandbox: SandboxConfig, origin: Mapping[str, str], command: list[str]
    ) -> Effective:
        fenced = _apply_sandbox(base, sandbox, origin, out)
        return replace(
            fenced,
            mounts=list(fenced.mounts),
            resources=resources,
            permissions=dict(permissions),
            read_paths_declared=list(declared),
            read_paths_granted=list(granted),
            env=dict(blueprint.env),
            env_pass=list(fenced.env_pass),
            env_withhold=list(fenced.env_withhold),
            hidden_paths=list(fenced.hidden_paths),
            protected_paths=list(fenced.protected_paths),
            hook_files_writable=list(fenced.hook_files_writable),
            allowlist=list(fenced.allowlist),
            rules=[*fenced.rules, *blueprint_rules],
            credentials=dict(fenced.credentials),
            command=list(command),
            proxy=proxy,
            tools=dict(own),
        )

    top, origin = _overlay(blueprint.sandbox, None, "")
    agent = effective(top, origin, list(blueprint.agent.command or []))
    stages: dict[str, Effective] = {}
    for name, stage in blueprint.stages.items():
        sb, sorigin = _overlay(
            blueprint.sandbox, stage.sandbox, f"blueprint [stages.{name}.sandbox]"
        )
        stages[name] = effective(sb, sorigin, list(stage.command))

    _read_path_findings(agent_name, declared, granted, out)
    used = set(_canonical_all(declared))
    for g in base.agent_grants:
        canon = _canonical_all([g])
        if canon and canon[0] not in used:
            out.add(
                "note",
                "read-path-grant-unused",
                f"config [agent_read_paths.{agent_name}] grants {g}, which the blueprint "
                "does not declare; a grant only applies to declared paths",
            )
    return MergeResult(
        agent=agent,
        stages=stages,
        seed=[list(c) for c in blueprint.seed.commands],
        findings=out.items,
    )


def _canonical_all(patterns: Iterable[str]) -> list[str]:
    result: list[str] = []
    for p in patterns:
        try:
            result.append(parse_pattern(p).text)
        except ReadPathError:
            continue
    return result
