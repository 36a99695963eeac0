"""List pages (leviathd/listing.py): cursors round-trip and reject anything
else, pages stop at the row limit and the byte budget, and one huge row is
cut down rather than sent whole."""

from __future__ import annotations

import pytest

from leviathd import listing
from leviathd.errors import InvalidArgument
from leviathd.records import AgentRecord, AgentState


def rec(n: int, *, command: list[str] | None = None) -> AgentRecord:
    return AgentRecord(
        id=f"{n:08x}", uid=1000, user="alice", agent="a", command=command or ["true"],
        workdir="/w", unit=f"leviath-alice-a-{n:08x}.scope", sandbox="none",
        started_at=1000.0 + n, ended_at=2000.0 + n, exit_status=0, state=AgentState.EXITED,
    )


@pytest.mark.parametrize("key", [
    listing.running_key(1764500000.123456, "0123abcd"),
    listing.ended_key(1764500000.5, "deadbeef"),
    listing.ended_key(0.0, "00000000"),
])
def test_cursors_round_trip(key: listing.Key) -> None:
    assert listing.parse_cursor(listing.cursor_of(key)) == key


@pytest.mark.parametrize("bad", ["x", "2:1.0:0123abcd", "0:nan:0123abcd", "0:inf:0123abcd",
                                 "0:1.0:0123ABCD", "0:1.0:0123abcd" + "0" * 60, "0:1e999:01234567"])
def test_anything_else_is_not_a_cursor(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        listing.parse_cursor(bad)


def test_running_agents_sort_before_ended_ones_and_ended_newest_first() -> None:
    keys = sorted([listing.ended_key(5.0, "aaaaaaaa"), listing.running_key(9.0, "bbbbbbbb"),
                   listing.ended_key(7.0, "cccccccc"), listing.running_key(1.0, "dddddddd")])
    assert [k[2] for k in keys] == ["dddddddd", "bbbbbbbb", "cccccccc", "aaaaaaaa"]


def test_a_page_stops_at_its_limit_and_names_the_last_row() -> None:
    page = listing.Page(limit=3, budget=1 << 20)
    keys = [listing.ended_key(100.0 - n, f"{n:08x}") for n in range(5)]
    taken = [page.add(k, rec(n)) for n, k in enumerate(keys)]
    assert taken[:3] == [True, True, True] and taken[3] is False
    assert listing.parse_cursor(page.next_cursor) == keys[2]


def test_a_page_stops_at_its_byte_budget() -> None:
    page = listing.Page(limit=1000, budget=20_000)
    n = 0
    while page.add(listing.ended_key(-n, f"{n:08x}"), rec(n)):
        n += 1
    assert 0 < len(page.records) < 1000
    assert sum(listing.estimate(r) for r in page.records) <= 20_000
    assert page.next_cursor


def test_one_huge_row_is_cut_down_not_sent_whole() -> None:
    huge = rec(1, command=["x" * (128 * 1024)] * 8)
    row = listing.trimmed(huge)
    assert listing.estimate(row) <= listing.MAX_ROW + 1024
    assert row.command[-1] == "[...]"
    page = listing.Page(limit=10, budget=listing.REPLY_BUDGET)
    assert page.add(listing.ended_key(0.0, huge.id), huge)
    assert page.records[0].command[-1] == "[...]"


def test_capped_json_fits_the_budget_and_marks_what_it_cut() -> None:
    import json

    from leviathd.listing import REPLY_BUDGET, capped_json

    small = [{"label": "agent", "spec": {"argv": ["true"], "env": {"A": "1"}}}]
    assert json.loads(capped_json(small)) == small
    huge = [{"label": "agent", "spec": {
        "argv": ["x" * 100_000] * 200, "env": {f"K{i}": "v" * 1000 for i in range(4096)},
    }}] * 3
    text = capped_json(huge)
    assert len(text.encode()) <= REPLY_BUDGET
    cut = json.loads(text)
    assert cut[0]["label"] == "agent" and "[...]" in cut[0]["spec"]["argv"]
    assert "[...]" in cut[0]["spec"]["env"]
