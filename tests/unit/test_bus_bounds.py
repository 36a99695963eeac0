"""leviathd.bus.bounds from the side of a local user calling the API: ids that
name something else, arguments that carry lines, a flood of calls in flight."""

from __future__ import annotations

import pytest

from leviathd.bus import bounds
from leviathd.errors import Busy, InvalidArgument


@pytest.mark.parametrize("value", [
    "../../etc", "0123456", "012345678", "0123456G", "0123ABCD", "01234567\n", " 01234567",
    12345678, None, b"01234567",
])
def test_an_agent_id_that_is_not_eight_hex_digits_is_refused(value: object) -> None:
    with pytest.raises(InvalidArgument):
        bounds.agent_id(value)


def test_an_agent_id_of_eight_hex_digits_passes() -> None:
    assert bounds.agent_id("0a1b2c3d") == "0a1b2c3d"


@pytest.mark.parametrize("value", [
    "0123456789abcde", "0123456789abcdef0", "0123456789abcdeg", "../0123456789abcd", 1, None,
])
def test_a_request_id_that_is_not_sixteen_hex_digits_is_refused(value: object) -> None:
    with pytest.raises(InvalidArgument):
        bounds.request_id(value)


def test_a_request_id_of_sixteen_hex_digits_passes() -> None:
    assert bounds.request_id("0123456789abcdef") == "0123456789abcdef"


@pytest.mark.parametrize("value", [
    "x" * 17, "yes\nno", "yes\0no", "\n", "\0", ["yes"], b"yes", None,
])
def test_a_text_argument_longer_than_its_bound_or_of_several_lines_is_refused(
    value: object,
) -> None:
    with pytest.raises(InvalidArgument):
        bounds.text(value, 16, "answer")


def test_a_text_argument_of_exactly_its_bound_passes() -> None:
    assert bounds.text("x" * 16, 16, "answer") == "x" * 16
    assert bounds.text("", 16, "answer") == ""


def test_an_excerpt_of_a_clients_string_carries_no_control_character_and_is_bounded() -> None:
    attack = "\x1b]0;owned\x07\x1b[2J\r\nFAKE LOG LINE\0" + "A" * 500
    shown = bounds.excerpt(attack)
    assert all(0x20 <= ord(ch) < 0x7F for ch in shown), shown
    assert shown.startswith("\\x1b]0;owned\\x07\\x1b[2J\\r\\nFAKE LOG LINE\\x00")
    assert shown.endswith(f"... ({len(attack)} characters)")
    assert len(shown) < bounds.EXCERPT * 4 + 40
    # A string within the bound is shown whole, with no length note.
    assert bounds.excerpt("x" * bounds.EXCERPT) == "x" * bounds.EXCERPT
    assert bounds.excerpt("x" * (bounds.EXCERPT + 1)).startswith("x" * bounds.EXCERPT + "...")


def test_one_connection_fanning_out_calls_is_stopped_at_its_share() -> None:
    flight = bounds.InFlight()
    for _ in range(bounds.PER_CALLER):
        flight.enter(":1.66")
    with pytest.raises(Busy):
        flight.enter(":1.66")
    # Another connection is still served, and the refused call left no count.
    flight.enter(":1.67")
    flight.leave(":1.66")
    flight.enter(":1.66")
    with pytest.raises(Busy):
        flight.enter(":1.66")


def test_a_connection_whose_calls_end_one_by_one_is_still_counted() -> None:
    # Ending one of two calls must not forget the other: else each end wipes
    # the count and a connection keeps any number in flight.
    flight = bounds.InFlight(per_caller=2, total=100)
    flight.enter(":1.66")
    flight.enter(":1.66")
    flight.leave(":1.66")
    flight.enter(":1.66")
    with pytest.raises(Busy):
        flight.enter(":1.66")


def test_the_per_connection_and_total_bounds_are_what_the_docs_say() -> None:
    # docs/dbus-api.md (org.leviath.Error.Busy) names these numbers; a larger
    # one is more work a client can queue.
    assert (bounds.PER_CALLER, bounds.TOTAL) == (32, 512)
    assert bounds.EXCERPT == 80
    assert (bounds.IN_FLIGHT.per_caller, bounds.IN_FLIGHT.total) == (32, 512)


def test_many_connections_together_are_stopped_at_the_total() -> None:
    flight = bounds.InFlight(per_caller=4, total=10)
    for n in range(10):
        flight.enter(f":1.{n}")
    with pytest.raises(Busy):
        flight.enter(":1.99")
    flight.leave(":1.3")
    flight.enter(":1.99")
    with pytest.raises(Busy):
        flight.enter(":1.100")


def test_calls_that_ended_leave_nothing_behind() -> None:
    flight = bounds.InFlight(per_caller=2, total=4)
    for n in range(1000):
        flight.enter(f":1.{n}")
        flight.leave(f":1.{n}")
    # Unique names are never reused: one kept per past connection would grow for good.
    assert not flight._by_sender
    assert flight._count == 0
    for _ in range(4):
        flight.enter(f":1.{2000 + _ // 2}")


def test_one_uid_over_many_connections_is_stopped_at_its_share() -> None:
    # Each connection within its own 32: without a share per uid, one user's
    # 16 connections held the whole total (tests/integration/test_redteam_bus2.py).
    flight = bounds.InFlight(per_caller=4, total=100, per_uid=6)
    for n in range(6):
        flight.enter(f":1.{n}")
        flight.enter_uid(1003)
    flight.enter(":1.50")
    with pytest.raises(Busy):
        flight.enter_uid(1003)
    flight.leave(":1.50")
    # Another uid, and callers the bus could not name, keep their own share.
    flight.enter_uid(1001)
    flight.enter_uid(None)
    # A call that ended gives its uid's place back, and only one.
    flight.leave_uid(1003)
    flight.enter_uid(1003)
    with pytest.raises(Busy):
        flight.enter_uid(1003)


def test_the_share_per_uid_leaves_room_for_several_users() -> None:
    # Issue 17: one user's 150 concurrent calls are all served.
    assert bounds.PER_UID == 160 and bounds.IN_FLIGHT.per_uid == 160
    # alice, bob and carol at their share leave room for dave.
    assert bounds.TOTAL - 3 * bounds.PER_UID >= 32
