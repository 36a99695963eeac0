"""How much of the daemon's one process a user's request bodies may take:
bytes of JSON parsed per second, per uid.

Parsing is CPU in the daemon's process whether it runs on the event loop or
in a thread (json holds the interpreter lock for most of it), so moving it
off the loop alone does not stop one user from slowing every other: 8
connections looping 1 MiB container creates on an agent's engine socket
made bob's `lev ps` up to ~6x slower. Each body is paced instead: a uid may
have RATE bytes a second parsed, BURST at once; a body past that waits
(asleep, costing nothing) until its user's share allows it, so a flood
costs others about RATE / (the parser's speed) of the daemon's time, a few
per cent, and an ordinary request (a few KiB) never waits.

`pace` is called before parsing by the engine socket (a body up to 1 MiB)
and by the broker as each chunk of a request line is read (so that lines
refused or dropped as too long cost the same share as those served);
CONNECTS paces the proxy's new connections the same way, before each is
accepted. Bus method calls have a bucket of their own (bus/pacing.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

MIB = 1 << 20
RATE = 4 * MIB  # bytes a second, per uid
BURST = 2 * MIB
# Buckets kept; past this, the full ones (users idle for a while) go.
KEEP = 1024


@dataclass
class _Bucket:
    tokens: float
    at: float


class Pacer:
    def __init__(self, rate: float = RATE, burst: float = BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._buckets: dict[int, _Bucket] = {}

    def wait_for(self, uid: int, n: int) -> float:
        """Charge n bytes to uid; the seconds to wait before parsing them
        (0 within the share). A charge past the share puts the bucket in
        debt, so that the next body of the same user waits behind this one."""
        now = self._clock()
        b = self._buckets.get(uid)
        if b is None:
            if len(self._buckets) >= KEEP:
                self._forget_full(now)
            b = self._buckets[uid] = _Bucket(self.burst, now)
        b.tokens = min(self.burst, b.tokens + (now - b.at) * self.rate)
        b.at = now
        b.tokens -= n
        return 0.0 if b.tokens >= 0 else -b.tokens / self.rate

    def _forget_full(self, now: float) -> None:
        for uid in [u for u, b in self._buckets.items()
                    if b.tokens + (now - b.at) * self.rate >= self.burst]:
            del self._buckets[uid]

    async def pace(self, uid: int, n: int) -> None:
        delay = self.wait_for(uid, n)
        if delay > 0:
            await asyncio.sleep(delay)


PACER = Pacer()
# New proxy connections a second, per uid: each costs the loop an identity
# check, a policy decision, a lookup and an audit record whatever it asks
# for, so a flood of them (unresolvable names, refused targets) is paced
# like bodies are. A burst of 128, then 64 a second: far above what a
# package manager opens, far below what a loop of connects can.
CONNECTS = Pacer(rate=64, burst=128)


async def pace(uid: int, n: int) -> None:
    """Wait until uid's share allows n more bytes to be parsed."""
    await PACER.pace(uid, n)
