"""Host names and IP addresses in one canonical form, for every part that
decides on a host (policy rules, the allowlist, the proxy's domain lists).

Why: a rule that names `127.0.0.1` or `localhost` compared the URL's literal
text, and the resolver reads many other spellings as the same host:
`2130706433`, `127.1`, `0x7f000001`, `0177.0.0.1` (inet_aton's forms),
`[::ffff:127.0.0.1]` (an IPv4-mapped IPv6 literal), `localhost.` (the root
label), fullwidth `ｌocalhost` or `127。0。0。1` (Python's resolver applies
IDNA, whose nameprep folds them to ASCII). `canonical_host` gives each of
them the one form a rule author writes; `address_facts` says what kind of
address a dialled IP is, judging IPv6 forms that carry an IPv4 address by
the IPv4 address inside.
"""

from __future__ import annotations

import ipaddress
import socket
import unicodedata

MAX_HOST = 253

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_V4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
# The dots IDNA (RFC 3490 §3.1) treats as label separators.
_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})


def embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries and may reach (mapped
    ::ffff:a.b.c.d, the old compatible ::a.b.c.d, NAT64 64:ff9b::a.b.c.d,
    6to4, Teredo), or None."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr in _V4_COMPATIBLE and int(addr) > 1:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if any(addr in net for net in _NAT64):
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr.teredo is not None:
        return addr.teredo[1]
    return None


def canonical_address(addr: Address) -> str:
    """An IP address as rules compare it: an IPv4-mapped IPv6 address is the
    IPv4 address it reaches (the kernel dials that one); other IPv6
    addresses in their compressed form."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


def canonical_host(host: str) -> str | None:
    """The one form of a host: ASCII (IDNA, which also folds fullwidth and
    other compatibility forms), lower case, no trailing dot, IPv6 without
    brackets or zone, IP literals in standard notation whatever their
    spelling. None: no host name or address at all."""
    h = unicodedata.normalize("NFKC", host.strip()).translate(_DOTS)
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if h.endswith("."):
        h = h[:-1]
    if not h or len(h) > MAX_HOST * 4:
        return None
    if not h.isascii():
        try:
            h = h.encode("idna").decode("ascii")
        except UnicodeError:
            return None
    h = h.lower()
    if not h or len(h) > MAX_HOST:
        return None
    try:
        return canonical_address(ipaddress.ip_address(h))
    except ValueError:
        pass
    if not all(c.isascii() and (c.isalnum() or c in "-._") for c in h):
        return None
    try:
        # The resolver reads 2130706433, 0x7f000001, 127.1 or 0177.0.0.1 as
        # an IPv4 address too (inet_aton): so do rules.
        if all(c.isalnum() or c == "." for c in h):
            return str(ipaddress.IPv4Address(socket.inet_aton(h)))
    except OSError:
        pass
    if any(not label or len(label) > 63 for label in h.split(".")):
        return None
    return h


def address_facts(address: str) -> dict[str, bool]:
    """What kind of address `address` is (all false for ""): the map rules
    see as `call.ip`. An IPv6 form carrying an IPv4 address is judged by the
    IPv4 address inside; an unspecified one is loopback too."""
    facts = {"loopback": False, "private": False, "link_local": False, "global": False,
             "multicast": False, "unspecified": False}
    if not address:
        return facts
    try:
        addr: Address = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return facts
    if isinstance(addr, ipaddress.IPv6Address):
        addr = embedded_ipv4(addr) or addr
    # Dialling 0.0.0.0 or :: reaches the host itself, as loopback does (issue
    # 48): `0`, `0x0`, `[::ffff:0.0.0.0]` and names resolving to it included.
    itself = addr.is_loopback or addr.is_unspecified
    facts.update(loopback=itself, private=addr.is_private and not addr.is_loopback
                 and not addr.is_link_local, link_local=addr.is_link_local,
                 multicast=addr.is_multicast, unspecified=addr.is_unspecified,
                 **{"global": addr.is_global})
    return facts
