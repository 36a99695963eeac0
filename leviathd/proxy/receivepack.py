"""The ref updates of a git push, from its smart-HTTP request (issue 30):
the body of `POST .../git-receive-pack` starts with pkt-lines
`OLD NEW REFNAME` (the first with `\\0capabilities`), ended by a flush
`0000`, then the pack. Pure; what a person approves is read from here, so it
is what the server is asked to do: the proxy sends on the very bytes it read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_UPDATES = 1000
MAX_COMMANDS = 1 << 20  # the command section, before the pack
_OID = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
ZERO = "0" * 40


@dataclass(frozen=True)
class RefUpdate:
    old: str
    new: str
    ref: str

    def text(self) -> str:
        if set(self.old) == {"0"}:
            return f"{self.ref}: create -> {self.new[:12]}"
        if set(self.new) == {"0"}:
            return f"{self.ref}: delete {self.old[:12]}"
        return f"{self.ref}: {self.old[:12]} -> {self.new[:12]}"


class Incomplete(Exception):
    """More bytes are needed to see the end of the commands."""


def parse_commands(data: bytes) -> tuple[list[RefUpdate], int]:
    """The updates and the length of the command section (through the
    flush). Raises Incomplete when `data` does not reach the flush yet,
    ValueError for what git would not send."""
    updates: list[RefUpdate] = []
    pos = 0
    while True:
        if len(data) < pos + 4:
            raise Incomplete
        try:
            size = int(data[pos:pos + 4], 16)
        except ValueError:
            raise ValueError("not a pkt-line") from None
        if size == 0:
            if not updates:
                raise ValueError("a push with no ref update")
            return updates, pos + 4
        if size < 4:
            raise ValueError("a special pkt-line in the commands")
        if len(data) < pos + size:
            raise Incomplete
        line = data[pos + 4:pos + size].split(b"\0", 1)[0].rstrip(b"\n").decode(
            "utf-8", "replace")
        parts = line.split(" ")
        if line.startswith("shallow ") and len(parts) == 2:
            pos += size
            continue
        if len(parts) != 3 or not _OID.match(parts[0]) or not _OID.match(parts[1]):
            raise ValueError("not a ref update line")
        ref = parts[2]
        if not ref.startswith("refs/") or any(ord(c) < 0x20 or c == "\x7f" for c in ref):
            raise ValueError("not a ref name")
        updates.append(RefUpdate(parts[0], parts[1], ref[:256]))
        if len(updates) > MAX_UPDATES:
            raise ValueError(f"more than {MAX_UPDATES} ref updates in one push")
        pos += size
        if pos > MAX_COMMANDS:
            raise ValueError("the commands of the push are too long")


def dechunk(data: bytes) -> bytes:
    """As much of a chunked body as `data` holds, decoded (for reading the
    commands only: what is sent on is the bytes as they came)."""
    out = bytearray()
    pos = 0
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            return bytes(out)
        try:
            size = int(data[pos:end].split(b";", 1)[0], 16)
        except ValueError:
            raise ValueError("a bad chunk size") from None
        if size == 0:
            return bytes(out)
        start = end + 2
        out += data[start:start + size]
        if len(data) < start + size + 2:
            return bytes(out)
        pos = start + size + 2
