"""What a covered host sends back to the agent, with the secrets the proxy put
into the request masked (issue 30): a host that says back the request's
Authorization header (a debugging endpoint, an error page quoting the
request) would otherwise hand the agent the very token that never entered
its sandbox.

Each occurrence becomes as many `*` (same length: Content-Length stays
true). A stream is read in pieces, so the end of a piece that could be the
start of a secret is held back until the next piece (or the end) shows
whether it is. The proxy feeds the answer's body decoded (chunk framing
gone, gzip and deflate inflated: proxy/tls.py), and every form it wrote the
secret in (`forms`: Basic's base64 of `user:secret`, `Bearer secret`, the
secret alone, URL-encoded) is a needle of its own (issue 44). A host that
encodes the secret in yet another way (its own base64 of it, an HTML
entity...) is not masked (docs/security-model.md says so).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from urllib.parse import quote, quote_plus

# A shorter secret would mask ordinary bytes of the answer as well.
MIN_LENGTH = 8


def forms(secret: str, written: str = "", user: str = "") -> list[str]:
    """Every spelling of `secret` the proxy wrote or a host may say back:
    the secret, its URL-encodings, the header value `written` as sent when it
    does not hold the secret plain, and Basic's base64 of `user:secret`."""
    out = {secret, quote(secret, safe=""), quote_plus(secret)}
    if secret not in written:  # a value that holds the secret plain is masked by it
        out.add(written)       # (`Bearer ` itself stays readable)
    if user:
        out.add(base64.b64encode(f"{user}:{secret}".encode()).decode())
    return sorted(f for f in out if f)


class Mask:
    def __init__(self, secrets: Iterable[str]) -> None:
        self._needles = sorted({s.encode() for s in secrets if len(s) >= MIN_LENGTH},
                               key=len, reverse=True)
        self._held = b""

    def __bool__(self) -> bool:
        return bool(self._needles)

    def feed(self, data: bytes) -> bytes:
        """The part of the stream so far that can be sent, masked."""
        buf = self._held + data
        for needle in self._needles:
            buf = buf.replace(needle, b"*" * len(needle))
        keep = max((self._partial(buf, n) for n in self._needles), default=0)
        self._held = buf[len(buf) - keep:] if keep else b""
        return buf[:len(buf) - keep] if keep else buf

    def flush(self) -> bytes:
        """At the end: what was held back (it was no whole secret)."""
        held, self._held = self._held, b""
        return held

    @staticmethod
    def _partial(buf: bytes, needle: bytes) -> int:
        """The length of the longest end of `buf` that begins `needle`."""
        i = buf.find(needle[:1], max(0, len(buf) - len(needle) + 1))
        while i != -1:
            if needle.startswith(buf[i:]):
                return len(buf) - i
            i = buf.find(needle[:1], i + 1)
        return 0
