"""Just enough HTTP/1.1 for the filtered engine socket: a request head read
with a bound, bodies by Content-Length or chunked (copied as they come, or
read whole up to a bound), and Docker-style error replies."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass

from leviathd.http import message, target, write
from leviathd.http.grammar import BadMessage

MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
COPY_CHUNK = 64 * 1024
# A header name is an HTTP token; a target and a value printable ASCII (a
# value may hold spaces and tabs). Go's server ends a line at a bare LF, so a
# LF (or CR, or NUL) inside what we took for one header would start another
# request the filter never saw (issue 29, break 2): such a head is refused.
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}\Z")
_VALUE = re.compile(r"^[\x20-\x7e\t]{0,8192}\Z")
_TARGET = re.compile(r"^/[\x21-\x7e]{0,8191}\Z")
# What reads a head is the one HTTP layer (leviathd/http/); these checks stay
# as the engine socket's own, narrower, bounds (ASCII values, short names).


class BadRequest(Exception):
    pass


class TooLarge(BadRequest):
    """A streamed body over what the agent may still upload."""


@dataclass
class Head:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def get(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]

    def body_kind(self) -> tuple[str, int]:
        """("chunked", 0), ("length", n) or ("none", 0): the one HTTP layer's
        framing (http/message.py), which refuses a body framed two ways or
        any coding but chunked alone; no second reading of it here."""
        try:
            framing = message.Head(tuple(self.headers)).framing()
        except BadMessage as exc:
            raise BadRequest(str(exc)) from None
        if framing.length >= 10**15:
            raise BadRequest("bad content-length")
        return framing.kind, framing.length

    def encode(self, target: str, headers: list[tuple[str, str]]) -> bytes:
        try:
            return write.request(self.method, target, headers)
        except BadMessage as exc:
            raise BadRequest(f"a request that cannot be written: {exc}") from None


async def read_head(reader: asyncio.StreamReader) -> Head | None:
    """None at a clean end of the connection before a request."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise BadRequest("the connection ended inside a request head") from None
    except asyncio.LimitOverrunError:
        raise BadRequest(f"the request head is over {MAX_HEAD} bytes") from None
    return parse_head(raw)


def parse_head(raw: bytes) -> Head:
    """A request head up to and with its blank line, every line checked by
    the one HTTP layer (leviathd/http/), its target in origin form."""
    try:
        req, _conn = message.parse_request(raw, need_host=False)
        path = target.origin_form(req.target)
    except BadMessage as exc:
        raise BadRequest(str(exc)) from None
    if not _TOKEN.match(req.method) or not _TARGET.match(path):
        raise BadRequest("not an HTTP/1.1 request line")
    for k, v in req.headers:
        if not _TOKEN.match(k) or not _VALUE.match(v):
            raise BadRequest("a malformed header")
    return Head(req.method, path, f"HTTP/{req.version}", list(req.headers))


async def read_body(reader: asyncio.StreamReader, head: Head, limit: int) -> bytes:
    kind, length = head.body_kind()
    if kind == "none":
        return b""
    if kind == "length":
        if length > limit:
            raise BadRequest(f"the request body is over {limit} bytes")
        return await reader.readexactly(length)
    out = bytearray()
    while True:
        size = await _chunk_size(reader)
        if size == 0:
            await _trailers(reader)
            return bytes(out)
        if len(out) + size > limit:
            raise BadRequest(f"the request body is over {limit} bytes")
        out += await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise BadRequest("a malformed chunk")


async def copy_body(reader: asyncio.StreamReader, head: Head, writer: asyncio.StreamWriter,
                    limit: int | None = None) -> int:
    """The request's body copied as it comes, exactly as framed, and nothing
    after it (a second request on the connection is never passed unread);
    the body's size. TooLarge once it is over `limit` (the bytes copied up
    to then are the caller's to charge: `TooLarge.args[1]`)."""
    kind, length = head.body_kind()
    total = 0
    if kind == "length":
        if limit is not None and length > limit:
            raise TooLarge(f"the request body of {length} bytes is over the {limit} bytes "
                           "left", 0)
        total = length
        while length:
            data = await reader.read(min(length, COPY_CHUNK))
            if not data:
                raise BadRequest("the connection ended inside the body")
            length -= len(data)
            writer.write(data)
            await writer.drain()
    elif kind == "chunked":
        while True:
            size = await _chunk_size(reader)
            total += size
            if limit is not None and total > limit:
                raise TooLarge(f"the request body is over the {limit} bytes left",
                               total - size)
            writer.write(f"{size:x}\r\n".encode())
            if size == 0:
                await _trailers(reader)
                writer.write(b"\r\n")
                await writer.drain()
                return total
            left = size
            while left:
                data = await reader.read(min(left, COPY_CHUNK))
                if not data:
                    raise BadRequest("the connection ended inside a chunk")
                left -= len(data)
                writer.write(data)
                await writer.drain()
            if await reader.readexactly(2) != b"\r\n":
                raise BadRequest("a malformed chunk")
            writer.write(b"\r\n")
    return total


async def _chunk_size(reader: asyncio.StreamReader) -> int:
    line = await reader.readuntil(b"\r\n")
    text = line[:-2].split(b";", 1)[0].strip()
    if not text or len(text) > 12:
        raise BadRequest("a malformed chunk size")
    try:
        return int(text, 16)
    except ValueError:
        raise BadRequest("a malformed chunk size") from None


async def _trailers(reader: asyncio.StreamReader) -> None:
    for _ in range(MAX_HEADERS):
        if await reader.readuntil(b"\r\n") == b"\r\n":
            return
    raise BadRequest("too many trailers")


def error_reply(status: int, text: str) -> bytes:
    reason = {400: "Bad Request", 403: "Forbidden", 404: "Not Found", 409: "Conflict",
              413: "Payload Too Large",
              500: "Internal Server Error", 502: "Bad Gateway",
              503: "Service Unavailable"}.get(status, "Error")
    body = json.dumps({"message": text}).encode() + b"\n"
    return write.answer(status, reason, "application/json", body)


def response_head(raw: bytes) -> tuple[int, Head]:
    """The status and headers of a reply head read up to its blank line."""
    try:
        head, _conn = message.parse_response(raw)
    except BadMessage as exc:
        raise BadRequest(f"the engine's reply is not HTTP: {exc}") from None
    return head.status, Head("GET", "/", f"HTTP/{head.version}", list(head.headers))


async def read_response(reader: asyncio.StreamReader, limit: int) -> tuple[int, bytes]:
    """A whole response (status, body), bounded: for the proxy's own questions."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise BadRequest("the engine's reply head is too long") from None
    status, head = response_head(raw)
    kind, _length = head.body_kind()
    if kind == "none":
        body = await reader.read(limit + 1)
        while len(body) <= limit:
            more = await reader.read(limit + 1 - len(body))
            if not more:
                break
            body += more
        if len(body) > limit:
            raise BadRequest("the engine's reply is too long")
        return status, body
    return status, await read_body(reader, head, limit)
