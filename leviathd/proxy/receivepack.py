"""The ref updates of a git push, from its smart-HTTP request (issue 30):
the body of `POST .../git-receive-pack` starts with pkt-lines
`OLD NEW REFNAME` (the first with `\\0capabilities`), ended by a flush
`0000`, then (when the first line's capabilities name `push-options`) the
push options, one a pkt-line, ended by another flush, then the pack. Pure;
what a person approves is read from here, so it is what the server is asked
to do: the proxy sends on the very body it read (decoded, framed anew).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_UPDATES = 1000
MAX_OPTIONS = 100
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


def _pkt(data: bytes, pos: int) -> tuple[bytes | None, int]:
    """The pkt-line at `pos` (None for a flush) and the position after it."""
    if len(data) < pos + 4:
        raise Incomplete
    try:
        size = int(data[pos:pos + 4], 16)
    except ValueError:
        raise ValueError("not a pkt-line") from None
    if size == 0:
        return None, pos + 4
    if size < 4:
        raise ValueError("a special pkt-line in the commands")
    if len(data) < pos + size:
        raise Incomplete
    return data[pos + 4:pos + size], pos + size


def parse_push(data: bytes) -> tuple[list[RefUpdate], list[str], int]:
    """The updates, the push options and the length of what precedes the
    pack. Raises Incomplete when `data` does not reach their end yet,
    ValueError for what git would not send."""
    updates: list[RefUpdate] = []
    caps: list[bytes] = []
    pos = 0
    while True:
        payload, pos = _pkt(data, pos)
        if pos > MAX_COMMANDS:
            raise ValueError("the commands of the push are too long")
        if payload is None:
            if not updates:
                raise ValueError("a push with no ref update")
            break
        command, nul, cap_text = payload.partition(b"\0")
        if nul and not caps:
            caps = cap_text.rstrip(b"\n").split(b" ")
        line = command.rstrip(b"\n").decode("utf-8", "replace")
        parts = line.split(" ")
        if parts[0] == "shallow" and len(parts) == 2:
            # git sends one per shallow commit it has; counted in the bytes
            # bound above like every other line, and only an object id.
            if not _OID.match(parts[1]):
                raise ValueError("not a shallow line")
            continue
        if len(parts) != 3 or not _OID.match(parts[0]) or not _OID.match(parts[1]):
            raise ValueError("not a ref update line")
        ref = parts[2]
        if (not ref.startswith("refs/") or len(ref) > 4096
                or any(ord(c) < 0x20 or c == "\x7f" for c in ref)):
            raise ValueError("not a ref name")
        updates.append(RefUpdate(parts[0], parts[1], ref))
        if len(updates) > MAX_UPDATES:
            raise ValueError(f"more than {MAX_UPDATES} ref updates in one push")
    options: list[str] = []
    if b"push-options" in caps:
        while True:
            payload, pos = _pkt(data, pos)
            if pos > MAX_COMMANDS:
                raise ValueError("the push options are too long")
            if payload is None:
                break
            options.append(payload.rstrip(b"\n").decode("utf-8", "replace"))
            if len(options) > MAX_OPTIONS:
                raise ValueError(f"more than {MAX_OPTIONS} push options")
    return updates, options, pos


def parse_commands(data: bytes) -> tuple[list[RefUpdate], int]:
    """The updates and the length of the command section (through the
    flush). Raises Incomplete when `data` does not reach the flush yet,
    ValueError for what git would not send."""
    updates, _options, _ = parse_push(data)
    pos = 0
    while True:
        payload, pos = _pkt(data, pos)
        if payload is None:
            return updates, pos
