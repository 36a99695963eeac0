"""Messages written by the daemon (issue 44): every name and value is checked
against the grammar again on the way out, so nothing read or made elsewhere
(an agent's header, a secret) can put a CR, LF or NUL on the wire."""

from __future__ import annotations

from collections.abc import Iterable

from leviathd.http import grammar
from leviathd.http.grammar import BadMessage
from leviathd.http.message import Framing


def _lines(first: bytes, headers: Iterable[tuple[str, str]]) -> bytes:
    out = [first]
    for name, value in headers:
        raw_name = name.encode("latin-1", "replace")
        raw_value = value.encode("latin-1", "replace")
        grammar.check_name(raw_name)
        grammar.check_value(raw_value)
        out.append(raw_name + b": " + raw_value)
    return b"\r\n".join(out) + b"\r\n\r\n"


def request(method: str, target: str, headers: Iterable[tuple[str, str]]) -> bytes:
    """An HTTP/1.1 request head; `target` in origin form (http/target.py) or,
    for CONNECT, authority form."""
    raw_method = method.encode("ascii", "replace")
    raw_target = target.encode("ascii", "replace")
    if not grammar.TOKEN.match(raw_method) or not grammar.TARGET.match(raw_target):
        raise BadMessage("a request line outside the grammar")
    return _lines(raw_method + b" " + raw_target + b" HTTP/1.1", headers)


def response(status: int, reason: str, headers: Iterable[tuple[str, str]]) -> bytes:
    line = f"HTTP/1.1 {status:03d} {reason}".encode("latin-1", "replace")
    if not 100 <= status <= 999 or not grammar.STATUS.match(line):
        raise BadMessage("a status line outside the grammar")
    return _lines(line, headers)


def answer(status: int, reason: str, content_type: str, body: bytes,
           headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """A whole answer with its body, the connection closed after it."""
    return response(status, reason, [("Content-Type", content_type),
                                     ("Content-Length", str(len(body))), *headers,
                                     ("Connection", "close")]) + body


class Encoder:
    """A body written with the framing its head (written by us) declares."""

    def __init__(self, framing: Framing) -> None:
        self.chunked = framing.kind == "chunked"
        self.to_close = framing.kind == "none"  # a response's body to the end
        self.left = framing.length if framing.kind == "length" else 0

    def data(self, data: bytes) -> bytes:
        if not data or self.to_close:
            return data
        if self.chunked:
            return b"%x\r\n" % len(data) + data + b"\r\n"
        if len(data) > self.left:
            raise BadMessage("more body than its Content-Length")
        self.left -= len(data)
        return data

    def end(self) -> bytes:
        if self.chunked:
            return b"0\r\n\r\n"
        if self.left:
            raise BadMessage("less body than its Content-Length")
        return b""
