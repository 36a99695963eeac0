"""What a covered host sends back to the agent, with the secrets the proxy put
into the request masked (issue 30): a host that says back the request's
Authorization header (a debugging endpoint, an error page quoting the
request) would otherwise hand the agent the very token that never entered
its sandbox.

Each occurrence becomes as many `*` (same length: Content-Length and chunk
sizes stay true). A stream is read in pieces, so the end of a piece that
could be the start of a secret is held back until the next piece (or the
end) shows whether it is. Only the secret's plain bytes are found: a
response compressed by the host, or one that encodes the secret otherwise,
is passed as it comes (docs/security-model.md says so).
"""

from __future__ import annotations

from collections.abc import Iterable

# A shorter secret would mask ordinary bytes of the answer as well.
MIN_LENGTH = 8


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
