"""The daemon trims its heap after broker calls, never per call (leviathd/heap.py)."""

from __future__ import annotations

import asyncio
import itertools

from leviathd import heap


def _run(calls: float, spacing: float, after: float,
         trims: list[float] | None = None) -> tuple[int, int]:
    """Trims during `calls` seconds of soon() every `spacing` s, and after."""
    trims = [] if trims is None else trims

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        trimmer = heap.Trimmer(lambda: trims.append(loop.time()), quiet=0.05, every=0.3)
        end = loop.time() + calls
        while loop.time() < end:
            trimmer.soon()
            await asyncio.sleep(spacing)
        during = len(trims)
        await asyncio.sleep(after)
        return during, len(trims) - during

    return asyncio.run(main())


def test_a_burst_of_calls_gets_one_trim_after_it() -> None:
    during, after = _run(calls=0.02, spacing=0.001, after=0.3)
    assert (during, after) == (0, 1)


def test_a_steady_flood_is_trimmed_now_and_then_not_per_call() -> None:
    # ~1000 calls over 1 s: a trim at the start (none done yet), then at most
    # one each 0.3 s, and one once the calls stop.
    trims: list[float] = []
    during, after = _run(calls=1.0, spacing=0.001, after=0.3, trims=trims)
    assert 2 <= during <= 4, trims
    assert after == 1
    flood = trims[:during]
    assert all(b - a > 0.29 for a, b in itertools.pairwise(flood)), trims



def test_calls_after_a_trim_get_theirs_once_they_stop_not_a_period_later() -> None:
    trims: list[float] = []
    last: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        trimmer = heap.Trimmer(lambda: trims.append(loop.time()), quiet=0.3, every=30)
        for pause in (0.4, 0.1, 1.0):  # the first trim comes 0.3 s after the first call
            trimmer.soon()
            last.append(loop.time())
            await asyncio.sleep(pause)

    asyncio.run(main())
    assert len(trims) == 2, trims
    assert trims[1] - last[-1] >= 0.3, (trims, last)
