"""Request targets: the origin form sent on, and the decoded path decisions
are made on (issue 44): pure."""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

from leviathd.http.grammar import MAX_TARGET, BadMessage

# RFC 3986: what stands as itself in a path (pchar and "/") and in a query
# (also "?"); any other VCHAR is percent-encoded on the way.
_PATH_OK = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                     b"-._~!$&'()*+,;=:@/")
_QUERY_OK = _PATH_OK | frozenset(b"?")
_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")


def _normal(part: bytes, ok: frozenset[int]) -> bytes:
    out = bytearray()
    i = 0
    while i < len(part):
        c = part[i]
        if c == 0x25:  # "%": a well-formed escape, its hex in capitals
            if not _ESCAPE.match(part, i):
                raise BadMessage("a % in the target that is no escape")
            out += b"%" + part[i + 1:i + 3].upper()
            i += 3
            continue
        if c <= 0x20 or c >= 0x7f:
            raise BadMessage("a control, space or non-ASCII byte in the target")
        out += bytes([c]) if c in ok else b"%%%02X" % c
        i += 1
    return bytes(out)


def _dots(path: bytes) -> bytes:
    """RFC 3986 5.2.4 on a path that begins with "/"."""
    out: list[bytes] = []
    segments = path.split(b"/")[1:]
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == b".":
            if last:
                out.append(b"")
        elif seg == b"..":
            if out:
                out.pop()
            if last:
                out.append(b"")
        else:
            out.append(seg)
    return b"/" + b"/".join(out)


def origin_form(target: str) -> str:
    """The target as sent on: "/" path ["?" query], no fragment, escapes in
    capitals, dot segments removed, other bytes percent-encoded."""
    raw = target.encode("latin-1", "replace")
    if len(raw) > MAX_TARGET or not raw.startswith(b"/"):
        raise BadMessage("a request target that is not in origin form")
    if b"#" in raw:
        raise BadMessage("a fragment in the request target")
    path, sep, query = raw.partition(b"?")
    out = _dots(_normal(path, _PATH_OK))
    if sep:
        out += b"?" + _normal(query, _QUERY_OK)
    return out.decode("ascii")


def decoded_path(target: str) -> str:
    """The path as a server behind CGI or a router may route it: decoded
    (twice, for a server that decodes again), `;params` cut from each
    segment, empty and dot segments gone, no trailing "/", lower case.
    For deciding only: it is never sent."""
    path = target.partition("?")[0].encode("latin-1", "replace")
    for _ in range(3):
        path = unquote_to_bytes(path)
    text = path.decode("utf-8", "replace").replace("\\", "/").lower()
    segments = [s.split(";", 1)[0] for s in text.split("/")]
    kept: list[str] = []
    for seg in segments:
        if seg in ("", "."):
            continue
        if seg == "..":
            if kept:
                kept.pop()
            continue
        kept.append(seg.strip())
    return "/" + "/".join(kept)
