"""Pacing of the bodies a user has the daemon parse (leviathd/parseshare.py),
on a clock the test turns."""

from __future__ import annotations

import pytest

from leviathd import parseshare
from leviathd.parseshare import MIB, Pacer


def test_ordinary_bodies_never_wait_and_a_flood_waits_at_its_users_rate() -> None:
    now = [0.0]
    pacer = Pacer(rate=4 * MIB, burst=2 * MIB, clock=lambda: now[0])
    assert all(pacer.wait_for(1001, 8 << 10) == 0 for _ in range(200))  # 1.6 MiB
    waits = [pacer.wait_for(1001, MIB) for _ in range(8)]
    # 8 MiB at once past a 2 MiB burst: the last waits for the debt at 4 MiB/s.
    assert waits[-1] > 1.5
    assert waits == sorted(waits)
    # Another user is not behind her.
    assert pacer.wait_for(1002, MIB) == 0


def test_the_share_comes_back_with_time() -> None:
    now = [0.0]
    pacer = Pacer(rate=4 * MIB, burst=2 * MIB, clock=lambda: now[0])
    for _ in range(6):
        pacer.wait_for(1001, MIB)
    now[0] += 10
    assert pacer.wait_for(1001, MIB) == 0


def test_idle_users_are_forgotten_past_keep() -> None:
    now = [0.0]
    pacer = Pacer(clock=lambda: now[0])
    for uid in range(parseshare.KEEP + 10):
        pacer.wait_for(uid, 1)
        now[0] += 1
    assert len(pacer._buckets) <= parseshare.KEEP


def test_an_idle_user_banks_no_more_than_the_burst() -> None:
    """Issue 50: the bucket is capped at BURST however long its user was
    idle, so a day's quiet buys her no flood the others pay for (seen
    failing with the cap dropped: 4 MiB/s x 86,400 s of credit)."""
    now = [0.0]
    pacer = Pacer(rate=4 * MIB, burst=2 * MIB, clock=lambda: now[0])
    assert pacer.wait_for(1001, 1) == 0  # known to the pacer
    now[0] += 86400
    waits = [pacer.wait_for(1001, MIB) for _ in range(6)]
    # 2 MiB at once, then the rest at the rate: 4 MiB of debt is one second.
    assert waits[:2] == [0, 0] and waits[2] > 0, waits
    assert abs(waits[-1] - 1.0) < 0.01, waits


def test_a_user_in_debt_is_not_forgotten_with_her_debt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past KEEP buckets only full ones (idle users) are dropped: one still
    in debt keeps it, or a flood would wipe its debt by making new uids."""
    monkeypatch.setattr(parseshare, "KEEP", 2)
    now = [0.0]
    pacer = Pacer(rate=4 * MIB, burst=2 * MIB, clock=lambda: now[0])
    for _ in range(6):
        pacer.wait_for(1001, MIB)  # 4 MiB in debt
    for uid in (2001, 2002, 2003):
        pacer.wait_for(uid, 1)
    assert pacer.wait_for(1001, 1) > 0.9


def test_new_proxy_connections_are_paced_past_their_burst() -> None:
    """CONNECTS: a burst of 128 new connections, then 64 a second."""
    uid = 4_000_000_123  # a uid no other test charges
    waits = [parseshare.CONNECTS.wait_for(uid, 1) for _ in range(200)]
    assert waits[0] == 0 and waits[100] == 0
    assert waits[-1] > 0.5, waits[-5:]
