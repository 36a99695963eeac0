"""Bus method calls paced per uid (leviathd/bus/pacing.py): a uid past its
share waits, asleep, and another uid's call does not wait behind it; the
journal says so once a uid a minute, never for every call."""

from __future__ import annotations

import asyncio
import logging

import pytest

from leviathd.bus import pacing
from leviathd.parseshare import Pacer


@pytest.fixture()
def fresh(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(pacing, "PACER", Pacer(rate=pacing.RATE, burst=pacing.BURST,
                                               clock=lambda: now[0]))
    monkeypatch.setattr(pacing, "_noted", {})
    return now


def test_a_burst_within_the_share_never_waits(fresh: list[float]) -> None:
    assert all(pacing.PACER.wait_for(1001, 1) == 0 for _ in range(pacing.BURST))


def test_past_the_share_a_uid_waits_and_another_does_not(
    fresh: list[float], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr(pacing.asyncio, "sleep", sleep)
    caplog.set_level(logging.INFO, logger=pacing.__name__)

    async def calls() -> None:
        for _ in range(pacing.BURST + 50):
            await pacing.turn(1001)
        await pacing.turn(1002)
        await pacing.turn(None)

    asyncio.run(calls())
    # alice's 50 past her burst waited, the last about 50 / RATE; bob and an
    # unknown caller did not wait at all.
    assert len(slept) == 50
    assert slept == sorted(slept)
    assert slept[-1] == pytest.approx(50 / pacing.RATE)
    notes = [r.getMessage() for r in caplog.records]
    assert notes == [f"bus calls of uid 1001 paced: over {int(pacing.RATE)} a second"]


def test_notes_are_bounded_in_all(fresh: list[float]) -> None:
    written = sum(pacing._note(uid, 0.0) for uid in range(100))
    assert written == pacing.NOTES_MAX
    assert not pacing._note(5, 1.0)  # noted already this minute
    assert pacing._note(5, pacing.NOTE_EVERY + 1)  # a minute on


def test_callers_the_bus_cannot_name_have_a_bucket_of_their_own(
    fresh: list[float], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 50: an unnamed caller (bus/errors.py's None) is paced in the
    UNKNOWN bucket, never in root's (uid 0): root's calls past its share do
    not slow it, nor it root's."""
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr(pacing.asyncio, "sleep", sleep)

    async def calls() -> None:
        for _ in range(pacing.BURST + 5):
            await pacing.turn(0)
        waited = len(slept)
        await pacing.turn(None)
        assert len(slept) == waited

    asyncio.run(calls())
    assert pacing.UNKNOWN in pacing.PACER._buckets
