"""Reading an agent's request lines safely: a line is bounded before it is
buffered, and its nesting is measured before `json.loads` could recurse
into it (a 300,000-deep array once raised RecursionError in the daemon)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from leviathd.broker.limits import too_large

CHUNK = 1 << 16
# The bytes that matter for nesting: brackets, and what starts or escapes
# inside a string (brackets inside strings do not nest).
_TOKENS = re.compile(rb'[\[\]{}"\\]')
_OPEN = frozenset(b"[{")
_CLOSE = frozenset(b"]}")


class TooLong(Exception):
    """A request line went over the limit; it was read and dropped."""


class Lines:
    """Newline-terminated lines from a stream, each at most `limit` bytes.
    An over-long line is dropped as it arrives (never held whole) and
    reported once, with TooLong, when its end is reached; the connection
    then goes on with the next line."""

    def __init__(self, reader: asyncio.StreamReader,
                 pace: Callable[[int], Awaitable[None]] | None = None) -> None:
        self.reader = reader
        self.buf = bytearray()
        # Awaited with each chunk's size before the next is read: every byte
        # read is charged (parseshare), whether its line is then served,
        # refused or dropped as too long; past the share nothing more is
        # read and the sender waits on its full socket.
        self.pace = pace

    async def next(self, limit: int) -> bytes | None:
        """The next line without its newline; None at the end of the stream."""
        over = False
        scanned = 0
        while True:
            nl = self.buf.find(b"\n", scanned)
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[: nl + 1]
                if over or len(line) > limit:
                    raise TooLong
                return line
            if len(self.buf) > limit:
                over = True
                self.buf.clear()
            scanned = len(self.buf)
            chunk = await self.reader.read(CHUNK)
            if chunk and self.pace is not None:
                await self.pace(len(chunk))
            if not chunk:
                if over:
                    raise TooLong
                return None
            self.buf += chunk


def json_depth_within(line: bytes, limit: int) -> bool:
    """Whether `line`'s brackets nest at most `limit` deep, scanning once,
    without recursion. Invalid JSON may pass; json.loads then refuses it."""
    if line.count(b"[") + line.count(b"{") <= limit:
        return True
    depth = 0
    in_string = False
    skip = -1
    for match in _TOKENS.finditer(line):
        pos = match.start()
        if pos == skip:
            continue
        c = line[pos]
        if in_string:
            if c == 0x5C:  # backslash: the next byte is escaped
                skip = pos + 1
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in _OPEN:
            depth += 1
            if depth > limit:
                return False
        elif c in _CLOSE:
            depth -= 1
    return True


def parse_request(line: bytes, max_depth: int) -> dict[str, Any]:
    """A request object; ValueError if it is not one, LimitExceeded (named
    json_max_depth) if it nests deeper than allowed."""
    if not json_depth_within(line, max_depth):
        raise too_large("json_max_depth", max_depth, "the request nests deeper")
    try:
        req = json.loads(line)
    except RecursionError:  # belt and braces: the scan above should prevent it
        raise too_large("json_max_depth", max_depth, "the request nests deeper") from None
    if not isinstance(req, dict):
        raise ValueError("a request is a JSON object")
    return req
