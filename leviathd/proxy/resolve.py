"""Name resolution for the proxy, so that one user's lookups never queue
another's.

getaddrinfo blocks a thread until the system's resolver answers or gives up
(with a name server that never answers, `timeout:5 attempts:2` is 10 s or
more), and asyncio's loop.getaddrinfo runs it in the loop's default
executor: a handful of threads (min(32, CPUs + 4)) shared with everything
else the daemon does in threads (`lev ps`'s usage figures, container starts).
An agent that asks its proxy for unresolvable names used to fill them all:
bob's proxied request then waited 15 s and got 502.

Here lookups run in a pool of their own (THREADS), and each agent and each
user holds at most PER_AGENT and PER_USER of its threads at once; a slot is
held until the lookup's thread is free again, not merely until the caller
stopped waiting, so lookups stuck in the system's resolver count against
whoever asked for them. A caller waits at most TIMEOUT for a slot and the
answer together. A name that did not resolve (no such name, a failure, a
timeout) is answered from memory for NEGATIVE_TTL, at most CACHE entries.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import socket
import time
from collections.abc import Callable, Hashable

THREADS = 32
PER_USER = 4
PER_AGENT = 2
TIMEOUT = 5.0
NEGATIVE_TTL = 10.0
CACHE = 4096

Lookup = Callable[[str, int], list[str]]


class ResolveError(Exception):
    """The name gave no address; the message says why, for the audit record."""


def system_lookup(host: str, port: int) -> list[str]:
    """The addresses of host, as the system resolves it (nsswitch, /etc/hosts,
    resolv.conf), in its order, each once."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(i[4][0]) for i in infos))


class _Slots:
    """At most `limit` held; acquire waits (first come, first served)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def acquire(self) -> None:
        if self.held < self.limit and not self.waiters:
            self.held += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release()  # handed a slot just as the wait ended
            else:
                self.waiters.remove(fut)
            raise

    def release(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes on: held stays
                return
        self.held -= 1

    @property
    def idle(self) -> bool:
        return self.held == 0 and not self.waiters


class Resolver:
    def __init__(self, lookup: Lookup = system_lookup, *, threads: int = THREADS,
                 per_user: int = PER_USER, per_agent: int = PER_AGENT,
                 timeout: float = TIMEOUT, negative_ttl: float = NEGATIVE_TTL,
                 cache: int = CACHE, clock: Callable[[], float] = time.monotonic) -> None:
        self._lookup = lookup
        self._threads = threads
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.per_user, self.per_agent = per_user, per_agent
        self.timeout, self.negative_ttl = timeout, negative_ttl
        self._cache_size = cache
        self._clock = clock
        self._failed: collections.OrderedDict[str, tuple[float, str]] = collections.OrderedDict()
        self._slots: dict[Hashable, _Slots] = {}

    def _pool_now(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=self._threads, thread_name_prefix="leviath-resolve")
        return self._pool

    def in_flight(self, key: Hashable) -> int:
        slots = self._slots.get(key)
        return slots.held if slots is not None else 0

    async def resolve(self, host: str, port: int, *, uid: int, agent: str) -> list[str]:
        key = host.lower()
        cached = self._failed.get(key)
        if cached is not None:
            if cached[0] > self._clock():
                raise ResolveError(f"{cached[1]} (answered from memory)")
            del self._failed[key]
        try:
            async with asyncio.timeout(self.timeout):
                return await self._resolve(host, port, uid, agent)
        except TimeoutError:
            why = f"no answer within {self.timeout:g} s"
        except OSError as exc:
            why = str(exc)[:200]
        self._remember(key, why)
        raise ResolveError(why)

    async def _resolve(self, host: str, port: int, uid: int, agent: str) -> list[str]:
        held: list[_Slots] = []
        try:
            for key, limit in ((("agent", agent), self.per_agent), (("uid", uid), self.per_user)):
                slots = self._slots.get(key)
                if slots is None:
                    slots = self._slots[key] = _Slots(limit)
                await slots.acquire()
                held.append(slots)
            loop = asyncio.get_running_loop()
            job = self._pool_now().submit(self._lookup, host, port)
        except BaseException:
            self._give_back(held)
            raise
        # The slots go back when the thread is done, whoever still waits.
        def done(_f: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._give_back, held)

        job.add_done_callback(done)
        return await asyncio.wrap_future(job)

    def _give_back(self, held: list[_Slots]) -> None:
        for slots in held:
            slots.release()
        for key in [k for k, s in self._slots.items() if s.idle]:
            del self._slots[key]

    def _remember(self, key: str, why: str) -> None:
        self._failed[key] = (self._clock() + self.negative_ttl, why)
        self._failed.move_to_end(key)
        while len(self._failed) > self._cache_size:
            self._failed.popitem(last=False)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


_shared: Resolver | None = None


def shared() -> Resolver:
    """The daemon's one resolver (every agent's proxy)."""
    global _shared
    if _shared is None:
        _shared = Resolver()
    return _shared
