"""leviathd.bus.calllog.CallLog: lines about callers' calls, budgeted per uid;
counts for what is held back, summed per uid once a window; bounded in memory
and in lines however many uids call; one timer for all of them."""

from __future__ import annotations

import asyncio
import logging
import re

from leviathd.bus.calllog import CallLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


def logger(name: str) -> tuple[logging.Logger, Lines]:
    out = logging.getLogger(f"test_calllog.{name}")
    out.propagate = False
    out.setLevel(logging.DEBUG)
    lines = Lines()
    out.handlers[:] = [lines]
    return out, lines


SUMMARY = re.compile(r"^uid (\d+): ([\d,]+) more lines on refused calls not logged")


def summed(messages: list[str]) -> dict[int, int]:
    found: dict[int, int] = {}
    for m in messages:
        match = SUMMARY.match(m)
        if match:
            found[int(match[1])] = found.get(int(match[1]), 0) + int(match[2].replace(",", ""))
    return found


def test_a_flooding_uid_gets_its_first_lines_and_one_summary_and_another_uid_its_lines() -> None:
    clock = Clock()
    src, lines = logger("flood")
    out, summaries = logger("flood.summary")
    calls = CallLog(per_uid=20, window=10.0, clock=clock, out=out)
    for n in range(2000):
        clock.now += 0.001
        calls.line(src, 1003, logging.INFO, "Reload refused (uid %s): %d", 1003, n)
    calls.line(src, 1001, logging.INFO, "Get refused (uid %s)", 1001)
    assert len(lines.records) == 21
    assert lines.messages()[-1] == "Get refused (uid 1001)"
    assert not summaries.records  # the window is not over
    clock.now += 10
    calls.flush()
    assert summed(summaries.messages()) == {1003: 1980}, summaries.messages()
    assert "1,980 more" in summaries.messages()[0]
    assert "at most 20 a uid every 10 s" in summaries.messages()[0]
    # The next window: the uid has its budget back, and nothing is summed twice.
    for _ in range(30):
        calls.line(src, 1003, logging.INFO, "Reload refused")
    assert len(lines.records) == 41
    clock.now += 10
    calls.flush()
    assert summed(summaries.messages()) == {1003: 1990}


def test_a_line_after_the_window_writes_the_summary_without_a_loop_or_timer() -> None:
    clock = Clock()
    src, lines = logger("lazy")
    out, summaries = logger("lazy.summary")
    calls = CallLog(per_uid=2, window=10.0, clock=clock, out=out)
    for _ in range(5):
        calls.line(src, 7, logging.INFO, "x")
    clock.now += 11
    calls.line(src, 7, logging.INFO, "x")
    assert summed(summaries.messages()) == {7: 3}
    assert len(lines.records) == 3


def test_the_summary_keeps_the_highest_level_it_holds() -> None:
    clock = Clock()
    src, _ = logger("level")
    out, summaries = logger("level.summary")
    calls = CallLog(per_uid=1, window=10.0, clock=clock, out=out)
    calls.line(src, 5, logging.INFO, "first")
    calls.line(src, 5, logging.INFO, "held")
    calls.line(src, 5, logging.ERROR, "polkit did not answer twice")
    calls.flush()
    assert [r.levelno for r in summaries.records] == [logging.ERROR]


def test_thousands_of_uids_stay_bounded_in_memory_and_lines_and_every_line_is_counted() -> None:
    clock = Clock()
    src, lines = logger("many")
    out, summaries = logger("many.summary")
    calls = CallLog(per_uid=20, window=10.0, total_burst=200, total_rate=10.0,
                    max_callers=100, summary_lines=10, clock=clock, out=out)
    sent = 0
    for round_ in range(3):
        for uid in range(5000):
            for _ in range(2):
                calls.line(src, 10_000 + uid, logging.INFO, "refused")
                sent += 1
            assert len(calls) <= 100
        clock.now += 0.5 * (round_ + 1)
    clock.now += 10
    calls.flush()
    # The shared budget: 200 at once and 10 a second (1.5 s passed inside the window).
    assert len(lines.records) <= 200 + 10 * 2
    assert len(summaries.records) <= 11
    counted = sum(summed(summaries.messages()).values())
    other = [m for m in summaries.messages() if "other callers" in m]
    assert len(other) == 1, summaries.messages()
    match = re.match(r"^([\d,]+) more lines on refused calls from ([\d,]+) other callers", other[0])
    assert match, other[0]
    counted += int(match[1].replace(",", ""))
    assert len(lines.records) + counted == sent


def test_idle_uids_are_forgotten_at_the_summary() -> None:
    clock = Clock()
    src, _ = logger("idle")
    out, _ = logger("idle.summary")
    calls = CallLog(per_uid=1, window=10.0, clock=clock, out=out)
    for uid in range(50):
        calls.line(src, uid, logging.INFO, "one")
    calls.line(src, 99, logging.INFO, "one")
    calls.line(src, 99, logging.INFO, "held")
    assert len(calls) == 51
    clock.now += 10
    calls.flush()
    assert len(calls) == 0


def test_an_unnamed_caller_is_budgeted_too() -> None:
    clock = Clock()
    src, lines = logger("none")
    out, summaries = logger("none.summary")
    calls = CallLog(per_uid=3, window=10.0, clock=clock, out=out)
    for _ in range(10):
        calls.line(src, None, logging.INFO, "Get refused (uid unknown)")
    calls.flush()
    assert len(lines.records) == 3
    assert summaries.messages()[0].startswith("callers the bus could not name: 7 more lines")


def test_one_timer_writes_every_uids_summary_on_a_running_loop() -> None:
    src, lines = logger("loop")
    out, summaries = logger("loop.summary")

    async def main() -> None:
        calls = CallLog(per_uid=1, window=0.05, out=out)
        loop = asyncio.get_running_loop()
        timers: list[object] = []
        real = loop.call_later

        def counted(*args: object, **kwargs: object) -> asyncio.TimerHandle:
            handle = real(*args, **kwargs)  # type: ignore[arg-type]
            timers.append(handle)
            return handle

        loop.call_later = counted  # type: ignore[method-assign]
        try:
            for uid in range(20):
                for _ in range(5):
                    calls.line(src, uid, logging.INFO, "refused")
            assert len(timers) == 1
            await asyncio.sleep(0.2)
        finally:
            loop.call_later = real  # type: ignore[method-assign]
        assert sum(summed(summaries.messages()).values()) + sum(
            int(m.split()[0].replace(",", "")) for m in summaries.messages()
            if "other callers" in m) == 20 * 4

    asyncio.run(main())
    assert len(lines.records) == 20


def test_every_hostile_user_flooding_at_once_leaves_another_users_lines_written() -> None:
    """Red team (tests/integration/test_redteam_bus2.py's bed has alice, bob
    and carol, each controlling only their own uid, plus the share of callers
    the bus could not name, which any of them reaches by leaving at once):
    all four flooding for two minutes, dave's refusals, one every 2 s, are all
    written (each flooder is held from its first line over budget to the
    window's end, so the total refills between)."""
    clock = Clock()
    src, lines = logger("hostile")
    out, _summaries = logger("hostile.summary")
    calls = CallLog(clock=clock, out=out)
    daves = 0
    for tick in range(120 * 200):
        clock.now += 0.005
        for uid in (1001, 1002, 1003, None):
            calls.line(src, uid, logging.INFO, "Reload refused (uid %s)", uid)
        if tick % 400 == 0:
            calls.line(src, 1004, logging.INFO, "Get refused (uid %s): %d", 1004, tick)
            daves += 1
    dave = [m for m in lines.messages() if m.startswith("Get refused (uid 1004)")]
    assert len(dave) == daves == 60
