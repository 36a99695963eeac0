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
from leviathd.hosts import canonical_host, embedded_ipv4

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
    # [proxy] host_ports and private_ranges (issue 30).
    host_ports: tuple[int, ...] = ()
    private_ranges: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "allow": [list(a) for a in self.allow], "deny": list(self.deny),
            "ports": list(self.ports),
            "clearance": [[p, int(s)] for p, s in self.clearance],
            "max_connections": self.max_connections, "taint_enabled": self.taint_enabled,
            "on_exceed": self.on_exceed, "default_clearance": int(self.default_clearance),
            "allow_private": self.allow_private,
            "host_ports": list(self.host_ports), "private_ranges": list(self.private_ranges),
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
            host_ports=tuple(int(p) for p in hp) if isinstance(hp := d.get("host_ports"), list)
            else (),
            private_ranges=strs(d.get("private_ranges")),
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
        host_ports=tuple(rules.host_ports),
        private_ranges=tuple(rules.private_ranges),
    )


# Names the agent may use for the host's own loopback, for a port in
# [proxy] host_ports: its own `localhost` is the sandbox's.
HOST_NAMES = frozenset({"localhost", "host.leviath.internal"})


def host_loopback(host: str) -> str | None:
    """The host's loopback address `host` (normalised) names, or None. Only
    these names and literal loopback addresses: a name resolving to 127.0.0.1
    is refused as before (a DNS answer must not open the host)."""
    if host in HOST_NAMES:
        return "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return str(ip) if ip.is_loopback else None


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
    local = host_loopback(host) is not None
    if local and port not in s.host_ports:
        return Decision("deny", "host-port",
                        f"{host}:{port} is the host's own loopback; [proxy] host_ports = "
                        f"[{port}] in the config opens that port (open now: "
                        f"{list(s.host_ports)})")
    if not local and port not in s.ports:
        return Decision("deny", "port", f"port {port} is not in [proxy] ports {list(s.ports)}")
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


def address_refusal(addr: net.Address, *, allow_private: bool,
                    private_ranges: Sequence[str] = ()) -> str | None:
    """The broker's check, with the host's loopback and link-local refused
    even where private addresses are allowed (the proxy runs on the host);
    an address in one of `private_ranges` passes as with allow_private."""
    inner = embedded_ipv4(addr) if isinstance(addr, ipaddress.IPv6Address) else None
    plain = inner or addr
    opened = allow_private or any(plain in ipaddress.ip_network(r) for r in private_ranges)
    why = net.address_refusal(addr, allow_private=opened, host_local_always=True)
    if why is not None and plain.is_loopback:
        return (f"{why}: the host's loopback is reached only by the names "
                f"{sorted(HOST_NAMES)} or a loopback address, for a port in [proxy] host_ports")
    if why is not None and not opened and plain.is_private and not plain.is_link_local:
        return (f"{addr} is a private address; [proxy] private_ranges = [\"{plain}/32\"] "
                "in the config opens it (or [taint] allow_private_addresses = true)")
    return why


def check_addresses(addrs: Sequence[str], *, allow_private: bool,
                    private_ranges: Sequence[str] = ()) -> str | None:
    """One refused address refuses the name: trying "the other one" would
    let a name that mixes public and private answers reach the private one."""
    for ip in addrs:
        reason = address_refusal(ipaddress.ip_address(ip.split("%")[0]),
                                 allow_private=allow_private, private_ranges=private_ranges)
        if reason is not None:
            return reason
    return None
