"""web_fetch, http_get and http_post on the host network.

The host is resolved once, every address it resolves to is checked, and the
connection goes to the checked address (Host header and TLS name stay the
URL's), so a DNS answer that changes between check and connect (rebinding)
cannot reach an address the check refused. Redirects are followed by hand
(GET only), and only within the same scheme, host and port; any other comes
back to the agent (see `request`).
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

from leviathd.errors import AccessDenied, InvalidArgument
from leviathd.hosts import canonical_host, embedded_ipv4

# Cloud metadata endpoints are refused even with allow_private_addresses:
# the flag exists for services on the LAN or loopback, and nothing an agent
# does needs the instance's credentials.
METADATA = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
MAX_BODY = 1 << 20
MAX_REDIRECTS = 5
TIMEOUT = 30.0

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressRefused(AccessDenied):
    pass


def address_refusal(
    addr: Address, *, allow_private: bool, host_local_always: bool = False
) -> str | None:
    """Why `addr` may not be contacted, or None. With `host_local_always`
    (the proxy, which runs on the host) loopback, link-local and non-unicast
    addresses are refused even where private addresses are allowed: the
    host's own loopback is the one thing the agent's network namespace keeps
    it from."""
    if isinstance(addr, ipaddress.IPv6Address):
        # ::ffff:a.b.c.d, ::a.b.c.d, NAT64 and the like reach the IPv4 address inside.
        inner = embedded_ipv4(addr)
        if inner is not None:
            why = address_refusal(inner, allow_private=allow_private,
                                  host_local_always=host_local_always)
            return f"{addr} carries {inner}: {why}" if why is not None else None
    if addr in METADATA:
        return f"{addr} is a cloud metadata address"
    if allow_private and not host_local_always:
        return None
    if addr.is_loopback:
        return f"{addr} is a loopback address"
    if addr.is_link_local:
        return f"{addr} is a link-local address"
    if addr.is_unspecified or addr.is_multicast or addr.is_reserved:
        return f"{addr} is not a unicast address"
    if allow_private:
        return None
    if addr.is_private or not addr.is_global:
        return f"{addr} is a private address (set [taint] allow_private_addresses)"
    return None


def resolve_checked(host: str, port: int, *, allow_private: bool) -> list[tuple[int, str]]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise InvalidArgument(f"cannot resolve {host!r}: {exc.strerror}") from None
    checked: list[tuple[int, str]] = []
    for family, _, _, _, sockaddr in infos:
        ip = str(sockaddr[0])
        addr = ipaddress.ip_address(ip.split("%")[0])
        reason = address_refusal(addr, allow_private=allow_private)
        if reason is not None:
            # One bad address refuses the host: trying "the other one" would let
            # a name that mixes public and private answers reach the private one.
            raise AddressRefused(f"refusing {host}: {reason} (set [taint] allow_private_addresses)")
        checked.append((family, ip))
    if not checked:
        raise InvalidArgument(f"{host!r} resolved to nothing")
    return checked


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        # The certificate is checked against the URL's host name, not the IP.
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Response:
    url: str
    status: int
    headers: dict[str, str]
    body: str
    truncated: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "status": self.status,
            "headers": self.headers,
            "body": self.body,
            "truncated": self.truncated,
        }


_KEPT_HEADERS = ("content-type", "content-length", "location", "last-modified", "etag")


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, or None for anything else."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = canonical_host(parts.hostname)
    if host is None:
        return None
    return parts.scheme, host, port


def request(
    method: str,
    url: str,
    *,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    allow_private: bool = False,
    follow_redirects: bool = True,
    max_bytes: int = MAX_BODY,
    timeout: float = TIMEOUT,
    address: str | None = None,
) -> Response:
    """One request. A redirect is followed only to the same scheme, host and
    port, which the gate already decided on; any other (another host, port
    or scheme, or a Location that does not parse) comes back to the agent as
    the 3xx response with its `location`, and reaching it is a new call
    that the gate decides afresh, with its own audit record (issue 21). Every
    failure is an InvalidArgument (or AddressRefused), never a bare ValueError.
    `address`: the one the gate decided on (resolve.py); every hop (all to
    the same host) dials it, checked again here."""
    start = _origin(url)
    if start is None:
        raise InvalidArgument(f"not an http(s) URL: {url[:200]!r}")
    for _ in range(MAX_REDIRECTS + 1):
        resp, location = _one(method, url, body=body, headers=headers,
                              allow_private=allow_private, max_bytes=max_bytes, timeout=timeout,
                              address=address)
        if not (follow_redirects and method == "GET" and location):
            return resp
        try:
            nxt = urljoin(url, location)
        except ValueError:
            return resp
        if _origin(nxt) != start:
            return resp
        url = nxt
    raise InvalidArgument(f"too many redirects from {url[:200]}")


def _one(
    method: str, url: str, *, body: bytes | None, headers: Mapping[str, str] | None,
    allow_private: bool, max_bytes: int, timeout: float, address: str | None = None,
) -> tuple[Response, str | None]:
    origin = _origin(url)
    if origin is None:
        raise InvalidArgument(f"not an http(s) URL: {url[:200]!r}")
    scheme, host, port = origin
    parts = urlsplit(url)
    if address is None:
        _, address = resolve_checked(host, port, allow_private=allow_private)[0]
    else:
        reason = address_refusal(ipaddress.ip_address(address.split("%")[0]),
                                 allow_private=allow_private)
        if reason is not None:
            raise AddressRefused(f"refusing {host}: {reason} (set [taint] "
                                 "allow_private_addresses)")
    cls = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    conn = cls(host, port, address, timeout)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        data = resp.read(max_bytes + 1)
        kept = {k.lower(): v[:2000] for k, v in resp.getheaders() if k.lower() in _KEPT_HEADERS}
        status = resp.status
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise InvalidArgument(f"{method} {url[:200]}: {str(exc)[:300]}") from None
    finally:
        conn.close()
    location = kept.get("location") if status in (301, 302, 303, 307, 308) else None
    out = Response(url, status, kept, data[:max_bytes].decode("utf-8", "replace"),
                   len(data) > max_bytes)
    return out, location
