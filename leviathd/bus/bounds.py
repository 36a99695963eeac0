"""Bounds on what a bus client can make the daemon hold or say.

Any local user can call the API (polkit decides later, and a refusal still
costs a reply), so input is checked by shape and length before anything else
uses it, and nothing a client sent is echoed back or logged beyond a short,
escaped excerpt. Calls in flight are counted per connection and in total: one
client sending hundreds of calls at once gets a named error for the excess
instead of queueing work and replies the daemon must hold."""

from __future__ import annotations

import re
from collections import Counter

from leviathd.errors import Busy, InvalidArgument

AGENT_ID = re.compile(r"[0-9a-f]{8}")
REQUEST_ID = re.compile(r"[0-9a-f]{16}")
# Per connection: `lev` makes one call at a time; a UI or script that fans out
# gets well past what a person does. In total: a cap on queued work.
PER_CALLER = 32
TOTAL = 512
# Per uid: a user opens as many connections as the bus lets her (256), so a
# cap per connection alone let carol, refused by polkit, hold the whole total
# with 16 and every other user got Busy (test_redteam_bus2.py). Above the 150
# concurrent calls one user's tool may send (issue 17, test_daemon_faults);
# three users at their share leave the total room for a fourth.
PER_UID = 160
EXCERPT = 80


def agent_id(value: object) -> str:
    if not isinstance(value, str) or not AGENT_ID.fullmatch(value):
        raise InvalidArgument("not an agent id (agent ids are 8 hexadecimal digits)")
    return value


def request_id(value: object) -> str:
    if not isinstance(value, str) or not REQUEST_ID.fullmatch(value):
        raise InvalidArgument("not an approval request id (16 hexadecimal digits)")
    return value


def text(value: object, limit: int, what: str) -> str:
    """A free-form string argument: at most `limit` characters, one line."""
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidArgument(f"{what}: at most {limit} characters")
    if "\0" in value or "\n" in value:
        raise InvalidArgument(f"{what}: must be a single line")
    return value


def excerpt(value: str, limit: int = EXCERPT) -> str:
    """A client's string, made safe to put in a reply or a log line."""
    shown = value[:limit].encode("unicode_escape").decode("ascii")
    return shown + (f"... ({len(value)} characters)" if len(value) > limit else "")


class InFlight:
    """Counts calls being served, by sender (a unique bus name)."""

    def __init__(
        self, per_caller: int = PER_CALLER, total: int = TOTAL, per_uid: int = PER_UID
    ) -> None:
        self.per_caller = per_caller
        self.total = total
        self.per_uid = per_uid
        self._by_sender: Counter[str] = Counter()
        # None: callers the bus could not name, one share for all of them.
        self._by_uid: Counter[int | None] = Counter()
        self._count = 0

    def enter(self, sender: str) -> None:
        if self._count >= self.total:
            raise Busy("leviathd is busy (too many calls in flight); try again")
        if self._by_sender[sender] >= self.per_caller:
            raise Busy(
                f"too many calls in flight from this connection (at most {self.per_caller})"
            )
        self._by_sender[sender] += 1
        self._count += 1

    def leave(self, sender: str) -> None:
        self._count -= 1
        self._by_sender[sender] -= 1
        if self._by_sender[sender] <= 0:
            del self._by_sender[sender]


    def enter_uid(self, uid: int | None) -> None:
        """After enter(), once the caller's uid is known (bus/caller.py keeps
        it per connection, so only a connection's first calls wait for it)."""
        if self._by_uid[uid] >= self.per_uid:
            raise Busy(f"too many calls in flight from this user (at most {self.per_uid})")
        self._by_uid[uid] += 1

    def leave_uid(self, uid: int | None) -> None:
        self._by_uid[uid] -= 1
        if self._by_uid[uid] <= 0:
            del self._by_uid[uid]


IN_FLIGHT = InFlight()
