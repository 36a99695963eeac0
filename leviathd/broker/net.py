"""web_fetch, http_get and http_post on the host network.

The host is resolved once, every address it resolves to is checked, and the
connection goes to the checked address (Host header and TLS name stay the
URL's), so a DNS answer that changes between check and connect (rebinding)
cannot reach an address the check refused. Redirects are followed by hand
(GET only) and each hop is checked again.
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


def address_refusal(addr: Address, *, allow_private: bool) -> str | None:
    """Why `addr` may not be contacted, or None."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr in METADATA:
        return f"{addr} is a cloud metadata address"
    if allow_private:
        return None
    if addr.is_loopback:
        return f"{addr} is a loopback address"
    if addr.is_link_local:
        return f"{addr} is a link-local address"
    if addr.is_private:
        return f"{addr} is a private address"
    if not addr.is_global or addr.is_multicast:
        return f"{addr} is not a public unicast address"
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
) -> Response:
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgument(f"not an http(s) URL: {url!r}")
        host = parts.hostname
        port = parts.port or (443 if parts.scheme == "https" else 80)
        _, address = resolve_checked(host, port, allow_private=allow_private)[0]
        cls = _PinnedHTTPS if parts.scheme == "https" else _PinnedHTTP
        conn = cls(host, port, address, timeout)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        try:
            conn.request(method, path, body=body, headers=dict(headers or {}))
            resp = conn.getresponse()
            data = resp.read(max_bytes + 1)
            kept = {k.lower(): v for k, v in resp.getheaders() if k.lower() in _KEPT_HEADERS}
            status = resp.status
        except (OSError, http.client.HTTPException) as exc:
            raise InvalidArgument(f"{method} {url}: {exc}") from None
        finally:
            conn.close()
        location = kept.get("location")
        redirect = status in (301, 302, 303, 307, 308) and location
        if follow_redirects and method == "GET" and redirect and location:
            url = urljoin(url, location)
            continue
        return Response(
            url, status, kept, data[:max_bytes].decode("utf-8", "replace"), len(data) > max_bytes
        )
    raise InvalidArgument(f"too many redirects from {url}")
