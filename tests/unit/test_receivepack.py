"""Issue 50: what a person approves of a push is what the push asks
(proxy/receivepack.py). Each refusal of a command section git would not
send, and each bound, on the bytes an agent's git (or the agent itself)
could put in a `POST .../git-receive-pack`."""

from __future__ import annotations

import pytest

from leviathd.proxy import receivepack
from leviathd.proxy.receivepack import MAX_COMMANDS, MAX_UPDATES, parse_commands

OLD, NEW = "1" * 40, "2" * 40


def pkt(line: str) -> bytes:
    data = line.encode() + b"\n"
    return b"%04x" % (len(data) + 4) + data


def test_the_updates_are_read_up_to_the_flush() -> None:
    body = pkt(f"{OLD} {NEW} refs/heads/main\0report-status") + pkt(
        f"{'0' * 40} {NEW} refs/tags/v1") + b"0000PACK"
    updates, end = parse_commands(body)
    assert [u.text() for u in updates] == [f"refs/heads/main: {OLD[:12]} -> {NEW[:12]}",
                                           f"refs/tags/v1: create -> {NEW[:12]}"]
    assert body[end:] == b"PACK"


@pytest.mark.parametrize("body", [
    b"0000PACK",  # no ref update at all: nothing for a person to see
    pkt(f"{OLD} {NEW} HEAD") + b"0000",  # not under refs/
    pkt(f"{OLD} {NEW} refs/heads/\x1b[2Jmain") + b"0000",  # a terminal escape
    pkt(f"{OLD} {NEW} refs/heads/a\x7fb") + b"0000",
    pkt(f"{OLD} not-an-object-id refs/heads/main") + b"0000",
    pkt(f"not-an-object-id {NEW} refs/heads/main") + b"0000",
    pkt(f"{OLD} {NEW} refs/heads/main extra") + b"0000",
    pkt(f"{OLD} {NEW} refs/heads/main") + b"0001" + pkt(f"{OLD} {NEW} refs/heads/x") + b"0000",
], ids=["empty", "not-refs", "escape", "del", "new-oid", "old-oid", "four-words", "delim"])
def test_a_command_section_git_would_not_send_is_refused(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_commands(body)


def test_too_many_updates_are_refused() -> None:
    one = pkt(f"{OLD} {NEW} refs/heads/b")
    with pytest.raises(ValueError, match="ref updates"):
        parse_commands(one * (MAX_UPDATES + 1) + b"0000")
    assert len(parse_commands(one * MAX_UPDATES + b"0000")[0]) == MAX_UPDATES


def test_a_command_section_past_its_bound_is_refused_before_its_end() -> None:
    # Long ref names (kept cut at 256 for the person): fewer updates than
    # MAX_UPDATES, more bytes than MAX_COMMANDS; refused once past it.
    line = pkt(f"{OLD} {NEW} refs/heads/{'r' * 2000}")
    n = MAX_COMMANDS // len(line) + 2
    assert n < MAX_UPDATES
    with pytest.raises(ValueError, match="too long"):
        parse_commands(line * n)


def test_shallow_lines_count_in_the_bound_and_are_object_ids_only() -> None:
    # A push from a shallow clone starts with `shallow <oid>` lines: an
    # endless run of them is refused once past MAX_COMMANDS (not waited on
    # for a flush), and one carrying anything but an object id is refused.
    shallow = pkt(f"shallow {OLD}")
    with pytest.raises(ValueError, match="too long"):
        parse_commands(shallow * (MAX_COMMANDS // len(shallow) + 2))
    with pytest.raises(ValueError, match="shallow"):
        parse_commands(pkt("shallow refs/heads/x") + pkt(f"{OLD} {NEW} refs/heads/b") + b"0000")
    updates, _ = parse_commands(shallow + pkt(f"{OLD} {NEW} refs/heads/b") + b"0000")
    assert [u.ref for u in updates] == ["refs/heads/b"]


def test_an_unfinished_section_asks_for_more() -> None:
    with pytest.raises(receivepack.Incomplete):
        parse_commands(pkt(f"{OLD} {NEW} refs/heads/main"))
