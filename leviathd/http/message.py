"""Message heads read into typed values (issue 44). A head is checked line by
line against the grammar (http/grammar.py), then parsed by h11, which also
decodes the body that follows (http/body.py); framing is one Content-Length
or `Transfer-Encoding: chunked` alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import h11

from leviathd.http import grammar
from leviathd.http.grammar import BadMessage

Kind = Literal["none", "length", "chunked"]


@dataclass(frozen=True)
class Framing:
    """How the body is delimited: none (a request's: empty; a response's: to
    the end of the connection), a length, or chunked."""

    kind: Kind
    length: int = 0


@dataclass(frozen=True)
class Head:
    """What both requests and responses have: headers as sent (name's case
    kept), every byte already in the grammar."""

    headers: tuple[tuple[str, str], ...]

    def get(self, name: str) -> str | None:
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), None)

    def all(self, name: str) -> list[str]:
        low = name.lower()
        return [v for k, v in self.headers if k.lower() == low]

    def framing(self) -> Framing:
        lengths = self.all("content-length")
        codings = self.all("transfer-encoding")
        if codings:
            if lengths or len(codings) > 1 or codings[0].lower() != "chunked":
                raise BadMessage("a body framed other than by one Content-Length or "
                                 "Transfer-Encoding: chunked alone")
            return Framing("chunked")
        if not lengths:
            return Framing("none")
        if len(lengths) > 1 or not lengths[0].isdigit() or len(lengths[0]) > 18:
            raise BadMessage("a bad or repeated Content-Length")
        return Framing("length", int(lengths[0]))


@dataclass(frozen=True)
class RequestHead(Head):
    method: str
    target: str
    version: str  # "1.0" or "1.1"


@dataclass(frozen=True)
class ResponseHead(Head):
    status: int
    reason: str
    version: str


def _headers(lines: list[bytes]) -> tuple[tuple[str, str], ...]:
    out = []
    for line in lines:
        name, value = grammar.header_line(line)
        out.append((name.decode("ascii"), value.decode("latin-1")))
    return tuple(out)


def parse_request(raw: bytes, *, need_host: bool = True
                  ) -> tuple[RequestHead, h11.Connection]:
    """A request head given up to and with its blank line: the head and the
    h11 connection that has read it (for its body, http/body.py). A proxy's
    CONNECT may come without Host (`need_host=False`)."""
    lines = grammar.head_lines(raw)
    parts = lines[0].split(b" ")
    if (len(parts) != 3 or not grammar.TOKEN.match(parts[0])
            or not grammar.TARGET.match(parts[1]) or len(parts[1]) > grammar.MAX_TARGET
            or not grammar.VERSION.match(parts[2])):
        raise BadMessage("not an HTTP/1.x request line")
    headers = _headers(lines[1:])
    if not need_host and not any(n.lower() == "host" for n, _ in headers):
        raw = raw[:-2] + b"Host: x\r\n\r\n"  # h11 asks one of HTTP/1.1; unused here
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=len(raw) + 1)
    conn.receive_data(raw)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise BadMessage(f"h11: {exc}") from None
    if not isinstance(event, h11.Request):
        raise BadMessage("not a whole request head")
    head = RequestHead(headers=headers, method=parts[0].decode("ascii"),
                       target=parts[1].decode("ascii"), version=parts[2][5:].decode("ascii"))
    head.framing()
    return head, conn


def parse_response(raw: bytes, method: str = "GET") -> tuple[ResponseHead, h11.Connection]:
    """A response head up to and with its blank line, to a request of
    `method` (a HEAD's answer has no body)."""
    lines = grammar.head_lines(raw)
    if not grammar.STATUS.match(lines[0]):
        raise BadMessage("not an HTTP/1.x status line")
    headers = _headers(lines[1:])
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=len(raw) + 1)
    # h11 reads an answer only to a request it saw sent; one that proposed
    # an upgrade, so that a 101 (the engine's attach, a websocket) is read too.
    conn.send(h11.Request(method=method, target="/", headers=[
        ("Host", "x"), ("Connection", "upgrade"), ("Upgrade", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(raw)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise BadMessage(f"h11: {exc}") from None
    if not isinstance(event, h11.Response | h11.InformationalResponse):
        raise BadMessage("not a whole response head")
    status_line = lines[0].decode("latin-1")
    head = ResponseHead(headers=headers, status=int(status_line[9:12]),
                        reason=status_line[13:], version=status_line[5:8])
    head.framing()
    return head, conn
