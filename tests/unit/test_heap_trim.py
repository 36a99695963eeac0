"""The daemon trims its heap after broker calls, never per call (leviathd/heap.py).

The Trimmer is driven on a loop of virtual time (`_Clock`), not the real
one: under a loaded CI machine a real 1 ms sleep can take 50 ms, and a test
that counted trims against wall time failed there once. What is checked is
the Trimmer's arithmetic of `quiet` and `every`, which needs no real time.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from leviathd import heap


class _Clock:
    """The three loop methods the Trimmer uses, on virtual time."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, fn: Callable[..., None], *args: Any) -> object:
        heapq.heappush(self._queue, (when, next(self._seq), fn, args))
        return object()  # the Trimmer only tests its handle against None

    def call_later(self, delay: float, fn: Callable[..., None], *args: Any) -> object:
        return self.call_at(self.now + delay, fn, *args)

    def advance(self, to: float) -> None:
        """Run every timer due by `to`, each at its own time, then stand at `to`."""
        while self._queue and self._queue[0][0] <= to:
            when, _, fn, args = heapq.heappop(self._queue)
            self.now = max(self.now, when)
            fn(*args)
        self.now = max(self.now, to)


def _drive(monkeypatch: pytest.MonkeyPatch, calls: Iterable[float], until: float, *,
           quiet: float, every: float) -> tuple[list[float], _Clock]:
    """soon() at each time of `calls`; the times of the trims up to `until`."""
    clock = _Clock()
    monkeypatch.setattr(heap.asyncio, "get_running_loop", lambda: clock)
    trims: list[float] = []
    trimmer = heap.Trimmer(lambda: trims.append(clock.time()), quiet=quiet, every=every)
    for at in calls:
        clock.advance(at)
        trimmer.soon()
    clock.advance(until)
    return trims, clock


def test_a_burst_of_calls_gets_one_trim_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # 20 calls in 20 ms: none trimmed yet, so one trim `quiet` after the first.
    burst = [i * 0.001 for i in range(20)]
    trims, _ = _drive(monkeypatch, burst, until=0.35, quiet=0.05, every=0.3)
    assert trims == [pytest.approx(0.05)]


def test_a_steady_flood_is_trimmed_now_and_then_not_per_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 1000 calls about 1 ms apart: a trim `quiet` after the first (none done
    # yet), then one each `every` at most, and one more once the calls stop.
    # Times are binary fractions: on virtual time a timer set for last+quiet
    # must find now-last == quiet exactly, not a rounding short of it.
    flood = [i / 1024 for i in range(1000)]
    trims, _ = _drive(monkeypatch, flood, until=1.5, quiet=1 / 16, every=5 / 16)
    during = [t for t in trims if t <= flood[-1]]
    after = [t for t in trims if t > flood[-1]]
    assert 2 <= len(during) <= 4, trims
    assert len(after) == 1, trims
    assert all(b - a >= 5 / 16 for a, b in itertools.pairwise(trims)), trims


def test_calls_after_a_trim_get_theirs_once_they_stop_not_a_period_later(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Calls at 0, 0.4 and 0.5: the first trim comes 0.3 s after the first
    # call; the second 0.3 s after the last call, not `every` (30 s) later.
    trims, _ = _drive(monkeypatch, [0.0, 0.4, 0.5], until=1.5, quiet=0.3, every=30)
    assert trims == [pytest.approx(0.3), pytest.approx(0.8)]
