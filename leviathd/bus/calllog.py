"""Journal lines about callers' calls, budgeted per uid.

Any local user, refused ones included, can call the bus API as fast as the bus
carries the calls, and each refusal (and each polkit hitch on the way) used to
be one line in the daemon's journal. journald drops a unit's entries past its
rate limit (units/leviathd.service), audit and end records with the rest, so a
caller's flood could push them out. Here each uid gets a budget (the token
bucket of audit/trail.py): PER_UID lines at once and PER_UID a WINDOW after
that; a line over it is counted, not written, and the counts become one line a
uid once the window is over ("uid 1003: 1,980 more lines on refused calls not
logged in the last 10 s"). A budget shared by all uids caps the total.

Bounded for any number of callers: at most MAX_CALLERS uids are tracked (the
least recently seen one is dropped for a new one; its held count goes to the
"other callers" line), at most SUMMARY_LINES uids get a summary line of their own
each window, and one timer, not one per caller, writes the summaries."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from leviathd.budget import Bucket

log = logging.getLogger(__name__)

PER_UID = 20
WINDOW = 10.0
TOTAL_BURST = 200
TOTAL_RATE = 10.0
MAX_CALLERS = 1024
SUMMARY_LINES = 10

Clock = Callable[[], float]


@dataclass
class _Caller:
    bucket: Bucket
    seen: float
    held: int = 0
    level: int = logging.INFO


@dataclass
class _Others:
    held: int = 0
    # Counted, not named: a set of uids would grow with every one dropped.
    callers: int = 0
    level: int = logging.INFO


class CallLog:
    def __init__(
        self, *, per_uid: int = PER_UID, window: float = WINDOW,
        total_burst: int = TOTAL_BURST, total_rate: float = TOTAL_RATE,
        max_callers: int = MAX_CALLERS, summary_lines: int = SUMMARY_LINES,
        clock: Clock = time.monotonic, out: logging.Logger = log,
    ) -> None:
        self.per_uid = per_uid
        self.window = window
        self._rate = per_uid / window
        self._max = max_callers
        self._summary_lines = summary_lines
        self._clock = clock
        self._out = out
        self._total = Bucket(total_burst, total_rate, total_burst, clock())
        # uid (None: the bus could not say) -> budget, least recently seen first.
        self._callers: dict[int | None, _Caller] = {}
        self._others = _Others()
        self._since: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._callers)

    def line(self, logger: logging.Logger, uid: int | None, level: int, msg: str,
             *args: object, exc_info: BaseException | None = None) -> None:
        """Write `msg % args` to `logger`, or count it for uid's summary."""
        now = self._clock()
        if self._since is not None and now - self._since >= self.window:
            self.flush()  # also without a loop (tests), and should a timer be late
        state = self._callers.pop(uid, None)
        if state is None:
            if len(self._callers) >= self._max:
                self._evict()
            state = _Caller(Bucket(self.per_uid, self._rate, self.per_uid, now), now)
        state.seen = now
        self._callers[uid] = state
        # Once a uid's lines are being counted, later ones wait for the same
        # summary: what is written in full is the start of each window.
        if not state.held and state.bucket.take(now):
            if self._total.take(now):
                logger.log(level, msg, *args, exc_info=exc_info)
                return
            state.bucket.give_back()
        state.held += 1
        state.level = max(state.level, level)
        self._hold(now)

    def _evict(self) -> None:
        uid = next(iter(self._callers))
        gone = self._callers.pop(uid)
        if gone.held:
            self._others.held += gone.held
            self._others.callers += 1
            self._others.level = max(self._others.level, gone.level)

    def _hold(self, now: float) -> None:
        if self._since is None:
            self._since = now
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop: the next line after the window, or flush()
            self._timer = loop.call_later(self.window, self.flush)

    def flush(self) -> None:
        """Write the window's summaries and forget uids that are idle."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self._clock()
        seconds = max(now - self._since, self.window) if self._since is not None else 0.0
        self._since = None
        held = sorted(((uid, s) for uid, s in self._callers.items() if s.held),
                      key=lambda item: -item[1].held)
        others = self._others
        self._others = _Others()
        limit = f"(at most {self.per_uid} a uid every {self.window:g} s are logged one by one)"
        for n, (uid, state) in enumerate(held):
            if n < self._summary_lines:
                who = "callers the bus could not name" if uid is None else f"uid {uid}"
                self._out.log(state.level, "%s: %s more lines on refused calls not logged in "
                              "the last %.0f s %s", who, f"{state.held:,}", seconds, limit)
            else:
                others.held += state.held
                others.callers += 1
                others.level = max(others.level, state.level)
            state.held = 0
            state.level = logging.INFO
        if others.held:
            self._out.log(others.level, "%s more lines on refused calls from %s other callers not "
                          "logged in the last %.0f s %s", f"{others.held:,}",
                          f"{others.callers:,}", seconds, limit)
        # A uid idle for a window has its whole budget back: it is the same
        # as a uid never seen, so it need not take room in the table.
        for uid in [uid for uid, s in self._callers.items() if now - s.seen >= self.window]:
            del self._callers[uid]


CALLS = CallLog()
