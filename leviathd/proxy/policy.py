"""What the proxy lets an agent connect to: pure decisions, no I/O.

A connection names a host and a port. In order:
  deny_domains (any layer) refuse; every layer's allow_domains must match
  (a layer that set none allows any name); the port must be allowed; then,
  with taint on, the agent's live taint is compared with the domain's
  clearance (the lowest of every matching `[proxy.clearance]` pattern, else
  the `shell` tool's clearance): above it, [taint] on_exceed says whether the
  connection is refused, held for a person, or let through.
The address the name resolves to is checked after this (`address_refusal`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import leviathd.broker.net as net
from leviathd.domain.sensitivity import Sensitivity
from leviathd.hosts import canonical_host

if TYPE_CHECKING:
    from leviathd.config.merge import Effective

DEFAULT_PORTS = (22, 80, 443)
DEFAULT_MAX_CONNECTIONS = 64
MAX_HOST = 253

Outcome = Literal["allow", "deny", "ask"]


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    rule: str
    reason: str
    clearance: Sensitivity | None = None


@dataclass(frozen=True)
class ProxySettings:
    """What one agent's proxy enforces; kept as JSON so a restarted daemon
    serves an adopted agent with the policy it started with."""

    allow: tuple[tuple[str, ...], ...] = ()
    deny: tuple[str, ...] = ()
    ports: tuple[int, ...] = DEFAULT_PORTS
    clearance: tuple[tuple[str, Sensitivity], ...] = ()
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    taint_enabled: bool = False
    on_exceed: str = "ask"
    default_clearance: Sensitivity = Sensitivity.INTERNAL
    allow_private: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "allow": [list(a) for a in self.allow], "deny": list(self.deny),
            "ports": list(self.ports),
            "clearance": [[p, int(s)] for p, s in self.clearance],
            "max_connections": self.max_connections, "taint_enabled": self.taint_enabled,
            "on_exceed": self.on_exceed, "default_clearance": int(self.default_clearance),
            "allow_private": self.allow_private,
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> ProxySettings:
        def strs(v: object) -> tuple[str, ...]:
            return tuple(str(x) for x in v) if isinstance(v, list) else ()

        allow = d.get("allow")
        clearance = d.get("clearance")
        ports = d.get("ports")
        return cls(
            allow=tuple(strs(a) for a in allow) if isinstance(allow, list) else (),
            deny=strs(d.get("deny")),
            ports=tuple(int(p) for p in ports) if isinstance(ports, list) else DEFAULT_PORTS,
            clearance=tuple((str(p), Sensitivity(int(s))) for p, s in clearance)
            if isinstance(clearance, list) else (),
            max_connections=int(str(d.get("max_connections", DEFAULT_MAX_CONNECTIONS))),
            taint_enabled=bool(d.get("taint_enabled")),
            on_exceed=str(d.get("on_exceed", "ask")),
            default_clearance=Sensitivity(int(str(d.get("default_clearance", 1)))),
            allow_private=bool(d.get("allow_private")),
        )


def from_effective(eff: Effective, *, taint_enabled: bool, on_exceed: str,
                   shell_clearance: Sensitivity | None, allow_private: bool) -> ProxySettings:
    """From `Effective.proxy` (leviathd/config/merge.py ProxyRules), read by
    name: a field renamed there fails mypy here instead of reading as an
    empty, permissive list."""
    rules = eff.proxy
    return ProxySettings(
        allow=tuple(tuple(a) for a in rules.allow),
        deny=tuple(rules.deny),
        ports=tuple(rules.ports) if rules.ports is not None else DEFAULT_PORTS,
        clearance=tuple(rules.clearance),
        max_connections=rules.max_connections if rules.max_connections is not None
        else DEFAULT_MAX_CONNECTIONS,
        taint_enabled=taint_enabled,
        on_exceed=on_exceed if on_exceed in ("allow", "deny", "ask") else "ask",
        default_clearance=shell_clearance if shell_clearance is not None
        else Sensitivity.INTERNAL,
        allow_private=allow_private,
    )


def normalize_host(host: str) -> str | None:
    """The host as the policy compares it: leviathd/hosts.py's one canonical
    form (IDNA, lower case, no trailing dot, IPv6 without brackets, any
    spelling of an IPv4 address in dotted quads), or None when it is no host
    name or address at all."""
    return canonical_host(host)


def matches(pattern: str, host: str) -> bool:
    """`*.example.com` matches names below example.com, not example.com itself."""
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def _any(patterns: Iterable[str], host: str) -> str | None:
    return next((p for p in patterns if matches(p, host)), None)


def clearance_of(s: ProxySettings, host: str) -> Sensitivity:
    found = [sens for p, sens in s.clearance if matches(p, host)]
    return min(found) if found else s.default_clearance


def decide(s: ProxySettings, host: str, port: int, taint: Sensitivity) -> Decision:
    denied = _any(s.deny, host)
    if denied is not None:
        return Decision("deny", "deny-domain", f"{host} matches deny_domains {denied!r}")
    for layer in s.allow:
        if _any(layer, host) is None:
            return Decision("deny", "not-allowed-domain", f"{host} is not in allow_domains")
    if port not in s.ports:
        return Decision("deny", "port", f"port {port} is not in ports {list(s.ports)}")
    if not s.taint_enabled:
        return Decision("allow", "allowed", "")
    clearance = clearance_of(s, host)
    if taint <= clearance:
        return Decision("allow", "allowed", "", clearance)
    why = (f"the agent holds {taint.name.lower()} data; {host} is cleared for "
           f"{clearance.name.lower()}")
    if s.on_exceed == "allow":
        return Decision("allow", "taint-allowed", why, clearance)
    if s.on_exceed == "ask":
        return Decision("ask", "taint-exceeds-clearance", why, clearance)
    return Decision("deny", "taint-exceeds-clearance", why, clearance)


def address_refusal(addr: net.Address, *, allow_private: bool) -> str | None:
    """The broker's check, with the host's loopback and link-local refused
    even where private addresses are allowed (the proxy runs on the host)."""
    return net.address_refusal(addr, allow_private=allow_private, host_local_always=True)


def check_addresses(addrs: Sequence[str], *, allow_private: bool) -> str | None:
    """One refused address refuses the name: trying "the other one" would
    let a name that mixes public and private answers reach the private one."""
    for ip in addrs:
        reason = address_refusal(ipaddress.ip_address(ip.split("%")[0]),
                                 allow_private=allow_private)
        if reason is not None:
            return reason
    return None
