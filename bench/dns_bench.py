"""bob's name lookups through the proxy's resolver while alice floods it with
names that never answer, against the same lookups idle; both the old way
(loop.getaddrinfo: the loop's default executor) and proxy/resolve.py, in
one run.

    PYTHONPATH=. /opt/leviath-dev/venv/bin/python bench/dns_bench.py

The lookup is a stand-in at the resolver's seam (no name server here):
alice's names block their thread for STUCK seconds, as getaddrinfo does
with a name server that never answers; bob's answer at once. alice keeps
FLOOD lookups in flight for the whole measurement.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable

from leviathd.proxy.resolve import ResolveError, Resolver

STUCK = 2.0
FLOOD = 48
SAMPLES = 8
PAUSE = 0.05


def lookup(host: str, port: int) -> list[str]:
    if host.endswith(".slow.test"):
        time.sleep(STUCK)
        raise OSError("no answer")
    return ["192.0.2.7"]


Resolve = Callable[[str, int, int, str], Awaitable[list[str]]]


async def old_way(host: str, port: int, uid: int, agent: str) -> list[str]:
    loop = asyncio.get_running_loop()
    return await asyncio.wait_for(loop.run_in_executor(None, lookup, host, port), 15)


def new_way(resolver: Resolver) -> Resolve:
    async def resolve(host: str, port: int, uid: int, agent: str) -> list[str]:
        return await resolver.resolve(host, port, uid=uid, agent=agent)

    return resolve


FAILED = [0]


async def bob(resolve: Resolve) -> float:
    """Median seconds of one bob lookup (one that failed counts as the time
    it took to fail: the proxy's 15 s, then 502)."""
    times = []
    for i in range(SAMPLES):
        t0 = time.perf_counter()
        try:
            await resolve(f"n{i}.bob.test", 443, 1002, "bob")
        except (OSError, TimeoutError, ResolveError):
            FAILED[0] += 1
        times.append(time.perf_counter() - t0)
        await asyncio.sleep(PAUSE)
    return statistics.median(times)


async def flooded(resolve: Resolve) -> float:
    stop = asyncio.Event()
    names = (f"{n:x}.slow.test" for n in itertools.count())

    async def one() -> None:
        while not stop.is_set():
            try:
                await resolve(next(names), 443, 1001, "alice")
            except (OSError, TimeoutError, ResolveError):
                pass

    tasks = [asyncio.create_task(one()) for _ in range(FLOOD)]
    await asyncio.sleep(0.2)
    try:
        return await bob(resolve)
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def main() -> None:
    print(f"bob's lookup, median of {SAMPLES}; alice: {FLOOD} lookups in flight, "
          f"each stuck {STUCK:g} s")
    for name, make in (("old (default executor)", lambda: old_way),
                       ("proxy/resolve.py", lambda: new_way(Resolver(lookup)))):
        resolve = make()
        idle = await bob(resolve)
        FAILED[0] = 0
        busy = await flooded(resolve)
        print(f"  {name:24} idle {idle * 1e3:8.2f} ms   flooded {busy * 1e3:9.2f} ms   "
              f"ratio {busy / idle:8.1f}x   bob failed {FAILED[0]} of {SAMPLES}")


if __name__ == "__main__":
    asyncio.run(main())
