"""Bus method calls paced per uid, so that one user's flood of calls costs
the daemon's one loop a bounded share and never queues another user's call.

Every call a client sends is read and unmarshalled on the daemon's loop
before anything can tell whose it is, then dispatched, answered and
(refused) logged. Calls in flight are capped per connection and per uid
(bounds.py), but a client that awaits each reply and sends the next one
at once (the usual flood: 8 connections x 4 calls of 100 KB, in
bench/neighbour_bench.py) stays under the caps and kept the loop about
two thirds busy with its calls alone: its replies came as fast as the
loop could make them.

Here each uid (from the bus, bus/caller.py; never from the message) has a
token bucket of calls: BURST at once, RATE a second after that. A call
past its uid's share waits, asleep and still counted in flight, until the
share allows it, so a flooding client's own replies slow to RATE a second
and, awaiting them, so do its calls: the loop's work for that uid is
bounded by RATE calls a second whatever it sends. Each uid has its own
bucket, so bob's call never waits behind alice's: the only delay her flood
can cause him is the loop's time for her RATE calls a second and for the
excess refused at once with Busy (bounds.PER_UID).

What this cannot bound: the bytes a client sends are still read and
unmarshalled before the call is known to be over its share (the bus
delivers every connection's messages on one socket). A client that sends
without awaiting replies gets Busy past its caps, each answered at once.
"""

from __future__ import annotations

import asyncio
import logging
import time

from leviathd.parseshare import Pacer

log = logging.getLogger(__name__)

# Far above a person's or a tool's use (`lev run` makes a handful of calls;
# issue 17's 150 concurrent Runs from one tool wait about a second more),
# far below what a loop of calls makes.
RATE = 50.0  # calls a second, per uid
BURST = 100
# The one bucket of callers the bus could not name (bus/errors.py's None).
UNKNOWN = -1

PACER = Pacer(rate=RATE, burst=BURST)
# One journal line a uid a minute says its calls are being paced, at most
# NOTES_MAX lines a minute in all. Not through calllog's budget, whose
# counts are those of refused calls (the summaries add up to them).
NOTE_EVERY = 60.0
NOTES_MAX = 10
_noted: dict[int, float] = {}


def _note(key: int, now: float) -> bool:
    """Whether to write the line for key now (and remember that it was)."""
    if now - _noted.get(key, -NOTE_EVERY) < NOTE_EVERY:
        return False
    for k in [k for k, at in _noted.items() if now - at >= NOTE_EVERY]:
        del _noted[k]
    if len(_noted) >= NOTES_MAX:
        return False
    _noted[key] = now
    return True


async def turn(uid: int | None) -> None:
    """Wait until uid's share allows one more call to be served."""
    key = UNKNOWN if uid is None else uid
    delay = PACER.wait_for(key, 1)
    if delay <= 0:
        return
    if _note(key, time.monotonic()):
        log.info("bus calls of uid %s paced: over %d a second",
                 "unknown" if uid is None else uid, int(RATE))
    await asyncio.sleep(delay)
