"""Pages of `List`: no reply grows with the number of agents a machine has run.

Order: agents whose scope runs (oldest start first), then ended ones (most
recent end first). A cursor is the position of the last row sent, so a page
asked for later starts right after it even if agents started or ended
meanwhile. Each page stops at a row count and at a byte budget well under the
reply limit (REPLY_LIMIT), estimated from the rows' JSON form, which is never
smaller than their D-Bus form by more than the per-field overhead added."""

from __future__ import annotations

import json
import math
import re

from leviathd.errors import InvalidArgument
from leviathd.records import AgentRecord

Key = tuple[int, float, str]

REPLY_LIMIT = 256 * 1024
REPLY_BUDGET = 224 * 1024
DEFAULT_ROWS = 500
MAX_ROWS = 1000
# One row is cut down to this (its command line and workdir shortened) so
# that a single huge command line cannot make a page exceed the limit.
MAX_ROW = 16 * 1024
_FIELD_OVERHEAD = 24
_CURSOR = re.compile(r"([01]):([-+0-9.e]{1,32}):([0-9a-f]{8})")


def running_key(started_at: float, agent_id: str) -> Key:
    return (0, started_at, agent_id)


def ended_key(ended_at: float, agent_id: str) -> Key:
    return (1, -ended_at, agent_id)


def cursor_of(key: Key) -> str:
    return f"{key[0]}:{key[1]!r}:{key[2]}"


def parse_cursor(cursor: str) -> Key | None:
    if not cursor:
        return None
    m = _CURSOR.fullmatch(cursor) if len(cursor) <= 64 else None
    if m is None:
        raise InvalidArgument("not a cursor from an earlier List page")
    try:
        value = float(m.group(2))
    except ValueError:
        raise InvalidArgument("not a cursor from an earlier List page") from None
    if not math.isfinite(value):
        raise InvalidArgument("not a cursor from an earlier List page")
    return (int(m.group(1)), value, m.group(3))


def estimate(rec: AgentRecord) -> int:
    """About the bytes of the row on the bus. Kept per record while the
    fields that change in a record's life stay the same: a List of 500
    agents must not serialise 500 records to measure them (issue 18)."""
    key = _version(rec)
    held = _ESTIMATES.get(rec.id)
    if held is not None and held[0] == key:
        return held[1]
    size = (len(rec.model_dump_json()) + 20 * _FIELD_OVERHEAD
            + 8 * (len(rec.command) + len(rec.marks)))
    if len(_ESTIMATES) >= _MEMO_MAX:
        _ESTIMATES.clear()
    _ESTIMATES[rec.id] = (key, size)
    return size


_MEMO_MAX = 8192
_ESTIMATES: dict[str, tuple[tuple[object, ...], int]] = {}


def _version(rec: AgentRecord) -> tuple[object, ...]:
    """What can change in a record once made (the rest is fixed at start;
    a trimmed copy differs in its command's length)."""
    return (rec.state, rec.exit_status, rec.ended_at, rec.supervisor_pid, rec.stop_requested,
            len(rec.command), rec.started_at)


def memo_version(rec: AgentRecord) -> tuple[object, ...]:
    return _version(rec)


def trimmed(rec: AgentRecord) -> AgentRecord:
    """The row as sent: a record larger than MAX_ROW loses the tail of its
    command line (the full record stays on disk)."""
    if estimate(rec) <= MAX_ROW:
        return rec
    command: list[str] = []
    room = MAX_ROW // 2
    for arg in rec.command[:256]:
        piece = arg[:room]
        room -= len(piece) + _FIELD_OVERHEAD
        if room <= 0:
            break
        command.append(piece)
    command.append("[...]")
    return rec.model_copy(update={"command": command, "workdir": rec.workdir[:4096],
                                  "marks": rec.marks[:32]})


class Page:
    def __init__(self, *, limit: int, budget: int) -> None:
        self.limit = max(1, min(limit, MAX_ROWS))
        self.budget = budget
        self.records: list[AgentRecord] = []
        self.next_cursor = ""
        self._used = 0
        self._last: Key | None = None

    def add(self, key: Key, rec: AgentRecord) -> bool:
        """Take the row if it fits; else close the page (False)."""
        row = trimmed(rec)
        size = estimate(row)
        if self.records and (len(self.records) >= self.limit or self._used + size > self.budget):
            assert self._last is not None
            self.next_cursor = cursor_of(self._last)
            return False
        self.records.append(row)
        self._used += size
        self._last = key
        return True


def capped_json(value: object, budget: int = REPLY_BUDGET) -> str:
    """`value` as JSON in at most `budget` bytes (Inspect's reply: a spec
    holds the client's command line and environment). Strings, lists and
    objects longer than an allowance are cut short and marked "[...]"; the
    allowance halves until the text fits."""
    text = json.dumps(value)
    room = 64 * 1024
    while len(text.encode()) > budget and room >= 1:
        text = json.dumps(_cut(value, room, max(room // 64, 1)))
        room //= 2
    if len(text.encode()) > budget:
        return json.dumps(["[...]"])
    return text


def _cut(value: object, chars: int, items: int) -> object:
    if isinstance(value, str):
        return value if len(value) <= chars else value[:chars] + "[...]"
    if isinstance(value, list):
        out = [_cut(v, chars, items) for v in value[:items]]
        return [*out, "[...]"] if len(value) > items else out
    if isinstance(value, dict):
        pairs = list(value.items())
        cut = {str(k)[:chars]: _cut(v, chars, items) for k, v in pairs[:items]}
        if len(pairs) > items:
            cut["[...]"] = f"{len(pairs) - items} more"
        return cut
    return value
