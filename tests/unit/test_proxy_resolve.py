"""The proxy's resolver (leviathd/proxy/resolve.py) with a stand-in lookup
at its seam: alice's names never answer until the test lets them, bob's at
once."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from leviathd.proxy.resolve import ResolveError, Resolver


class Stuck:
    """Names under slow.test block their thread until `free` is set."""

    def __init__(self) -> None:
        self.free = threading.Event()
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        if host.endswith(".slow.test"):
            self.free.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        if host.endswith(".none.test"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return ["192.0.2.7"]


def test_bob_is_answered_while_alices_lookups_hang() -> None:
    stuck = Stuck()
    resolver = Resolver(stuck, threads=8, per_user=3, per_agent=2, timeout=60)

    async def run() -> None:
        alice = [asyncio.create_task(resolver.resolve(f"n{i}.slow.test", 443, uid=1001,
                                                      agent=f"a{i % 3}"))
                 for i in range(60)]
        for _ in range(20):  # every task runs to its first wait (slots are taken at once)
            await asyncio.sleep(0)
        # alice holds her share of threads and no more, however many she asked for.
        assert resolver.in_flight(("uid", 1001)) == 3
        got = await resolver.resolve("www.bob.test", 443, uid=1002, agent="b")
        assert got == ["192.0.2.7"]
        stuck.free.set()
        results = await asyncio.gather(*alice, return_exceptions=True)
        assert all(isinstance(r, ResolveError) for r in results)

    try:
        asyncio.run(run())
    finally:
        stuck.free.set()
        resolver.close()


def test_a_lookup_past_the_timeout_keeps_its_slot_until_its_thread_is_free() -> None:
    stuck = Stuck()
    resolver = Resolver(stuck, threads=4, per_user=1, per_agent=1, timeout=0.05)

    async def run() -> None:
        with pytest.raises(ResolveError, match="no answer within"):
            await resolver.resolve("x.slow.test", 443, uid=1001, agent="a")
        # The caller gave up; the thread has not: the slot is still alice's.
        assert resolver.in_flight(("uid", 1001)) == 1
        # Its thread may not have been scheduled yet on a loaded machine
        # (the lookup timed out first): waited for, with a bound.
        for _ in range(1000):
            if stuck.calls:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(ResolveError, match="no answer within"):
            await resolver.resolve("y.slow.test", 443, uid=1001, agent="a")
        assert stuck.calls == ["x.slow.test"]  # the second never got a thread
        stuck.free.set()
        while resolver.in_flight(("uid", 1001)):
            await asyncio.sleep(0.01)
        assert await resolver.resolve("ok.test", 443, uid=1001, agent="a") == ["192.0.2.7"]

    try:
        asyncio.run(run())
    finally:
        stuck.free.set()
        resolver.close()


def test_a_name_that_did_not_resolve_is_answered_from_memory_for_a_while() -> None:
    stuck = Stuck()
    now = [100.0]
    resolver = Resolver(stuck, negative_ttl=10, clock=lambda: now[0])

    async def run() -> None:
        for _ in range(5):
            with pytest.raises(ResolveError):
                await resolver.resolve("gone.none.test", 80, uid=1001, agent="a")
        assert stuck.calls == ["gone.none.test"]
        now[0] += 11
        with pytest.raises(ResolveError):
            await resolver.resolve("gone.none.test", 80, uid=1001, agent="a")
        assert stuck.calls == ["gone.none.test"] * 2

    try:
        asyncio.run(run())
    finally:
        resolver.close()


def test_the_negative_cache_is_bounded() -> None:
    resolver = Resolver(Stuck(), cache=16)

    async def run() -> None:
        for i in range(100):
            with pytest.raises(ResolveError):
                await resolver.resolve(f"n{i}.none.test", 80, uid=1001, agent="a")

    try:
        asyncio.run(run())
        assert len(resolver._failed) == 16
    finally:
        resolver.close()
