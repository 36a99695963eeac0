"""The string boundary (leviathd/safetext.py): what reaches systemd and journald."""

from __future__ import annotations

import pytest

from leviathd import safetext
from leviathd.agents.request import RunInput
from leviathd.errors import InvalidArgument


@pytest.mark.parametrize("argv0, name", [
    ("/usr/bin/sleep", "sleep"),
    ("python3.12", "python3-12"),
    ("./x\nOnSuccess=rt5-flag.service", "x-OnSuccess-rt5-flag-service"),
    ("x\nleviathd.service\n0\n1\n0\n0\n0", "x-leviathd-service-0-1-0-0-0"),
    ("bad\udcffname", "bad-name"),
    ("\n\n", "agent"),
    ("", "agent"),
    ("-rf", "rf"),
    ("n" * 300, "n" * 64),
])
def test_agent_names_from_argv0_follow_the_blueprint_rules(argv0: str, name: str) -> None:
    assert safetext.agent_name(argv0) == name
    assert safetext.NAME_RE.match(safetext.agent_name(argv0))


def test_unit_names_are_bounded_and_plain() -> None:
    unit = safetext.unit_name("alice", "n" * 64, "0123abcd")
    assert unit == f"leviath-alice-{'n' * 64}-0123abcd.scope"
    assert safetext.unit_name("a\nb", "x", "1").startswith("leviath-a_b-x-1")
    with pytest.raises(InvalidArgument):
        safetext.check_unit_name("x\n.scope")


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\x1b[2Jb", "a\u2028b", "a\u202eb", "a\udcffb"])
def test_control_characters_never_reach_a_unit_property(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        safetext.description(bad)
    assert not safetext.has_control(safetext.escape(bad))


def test_descriptions_are_bounded() -> None:
    assert len(safetext.description("d" * 5000)) == safetext.DESCRIPTION_MAX


def test_the_stream_header_is_exactly_seven_lines_with_the_level_prefix_off() -> None:
    header = safetext.stream_header(identifier="leviath-agent", unit="leviath-a-b-1.scope",
                                    priority=6)
    assert header == b"leviath-agent\nleviath-a-b-1.scope\n6\n0\n0\n0\n0\n"
    for ident in ("x\nleviathd.service", "x\x00"):
        with pytest.raises(InvalidArgument):
            safetext.stream_header(identifier=ident, unit="", priority=6)
    with pytest.raises(InvalidArgument):
        safetext.stream_header(identifier="x", unit="u\n0", priority=6)
    with pytest.raises(InvalidArgument):
        safetext.stream_header(identifier="x", unit="", priority=9)


def test_journal_fields_are_escaped_and_named_by_the_daemon() -> None:
    f = safetext.journal_fields("m\nPRIORITY=0", {"leviath_target": "t\x1b]0;x\x07", "n": None})
    assert f == {"MESSAGE": "m\\nPRIORITY=0", "LEVIATH_TARGET": "t\\x1b]0;x\\x07"}
    with pytest.raises(ValueError):
        safetext.journal_fields("m", {"priority": "0"})
    with pytest.raises(ValueError):
        safetext.journal_fields("m", {"_uid": "0"})


def _req(**kw: object) -> dict[str, object]:
    from dbus_fast import Variant

    sig = {"command": "as", "workdir": "s", "env": "a{ss}", "blueprint_source": "s"}
    return {k: Variant(sig[k], v) for k, v in kw.items()}


def test_run_requests_are_bounded() -> None:
    with pytest.raises(InvalidArgument):
        RunInput.from_variants(_req(command=["x"] * 5000, workdir="/w"))
    with pytest.raises(InvalidArgument):
        RunInput.from_variants(_req(command=["x"], workdir="/w", env={"A=B": "1"}))
    with pytest.raises(InvalidArgument):
        RunInput.from_variants(_req(command=["x"], workdir="/w", env={"A": "1\x00"}))
    req = RunInput.from_variants(_req(command=["x"], workdir="/w", blueprint_source="a\nb"))
    assert req.blueprint_source == "a\\nb"


# From here: what a hostile agent or user chooses (argv[0], a blueprint's
# name, a tool's target, its output), at the exact bounds the boundary keeps.

@pytest.mark.parametrize("argv0, name", [
    ("sleep\n", "sleep"),  # `$` lets one final newline through a match
    ("/usr/bin/x\n", "x"),
    ("a-", "a-"),
    ("a_", "a_"),
    ("/a/b/c-d", "c-d"),
])
def test_agent_names_never_end_in_a_newline_and_keep_what_is_valid(argv0: str, name: str) -> None:
    assert safetext.agent_name(argv0) == name


@pytest.mark.parametrize("bad", ["x\n", "\nx", "x\ny", "-x", "_x", "", "x" * 65, "x.y", "x y"])
def test_a_blueprint_name_off_the_rules_is_refused(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        safetext.check_name(bad)


@pytest.mark.parametrize("good", ["x", "X-1_y", "x" * 64])
def test_a_blueprint_name_on_the_rules_is_kept(good: str) -> None:
    assert safetext.check_name(good) == good


def test_unit_names_are_refused_past_systemds_limit_or_with_a_final_newline() -> None:
    # systemd's UNIT_NAME_MAX is 256 with the NUL: 255 characters is the most.
    longest = "a" * (255 - len(".scope")) + ".scope"
    assert safetext.check_unit_name(longest) == longest
    for bad in ("a" + longest, "leviath-a-b-1.scope\n", "x.scope\n\n", "x.mount", ".scope"):
        with pytest.raises(InvalidArgument):
            safetext.check_unit_name(bad)


def test_unit_name_parts_are_cut_at_their_bounds() -> None:
    unit = safetext.unit_name("u" * 100, "n" * 100, "i" * 100)
    assert unit == f"leviath-{'u' * 64}-{'n' * 64}-{'i' * 32}.scope"


def test_descriptions_are_cut_to_200_with_an_ellipsis_and_kept_up_to_it() -> None:
    assert safetext.description("d" * 200) == "d" * 200
    assert safetext.description("d" * 201) == "d" * 199 + "…"


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85", "\x7f", "\u200b", "\ufeff"])
def test_unicode_line_breaks_and_invisible_characters_are_escaped(sep: str) -> None:
    with pytest.raises(InvalidArgument):
        safetext.description(f"a{sep}b")
    out = safetext.escape(f"a{sep}b")
    assert sep not in out and out.startswith("a\\") and out.endswith("b")


def test_a_journal_message_is_cut_at_8192_after_escaping() -> None:
    assert safetext.journal_fields("m" * 8192, {})["MESSAGE"] == "m" * 8192
    assert safetext.journal_fields("m" * 8193, {})["MESSAGE"] == "m" * 8191 + "…"
    # Escaping makes it longer: the cut is of the escaped text, never mid-escape
    # into a raw control character.
    long = safetext.journal_fields("\x1b" * 3000, {"x": "\n" * 5000})
    assert long["MESSAGE"] == "\\x1b" * 2047 + "\\x1" + "…"
    assert long["X"] == "\\n" * 4095 + "\\" + "…"
    assert not any(safetext.has_control(v) for v in long.values())


def test_escape_cuts_plain_text_at_its_limit() -> None:
    assert safetext.escape("a" * 80, 80) == "a" * 80
    assert safetext.escape("a" * 81, 80) == "a" * 79 + "…"
    assert safetext.escape("\x1b[2J", 5) == "\\x1b…"
    assert safetext.escape("\x1b", 4) == "\\x1b"


def test_the_journal_identifier_is_cut_at_64() -> None:
    def ident(header: bytes) -> str:
        return header.decode().split("\n")[0]

    assert ident(safetext.stream_header(identifier="i" * 64, unit="", priority=6)) == "i" * 64
    assert ident(safetext.stream_header(identifier="i" * 65, unit="", priority=6)) == (
        "i" * 63 + "…")


@pytest.mark.parametrize("priority", [0, 7])
def test_the_stream_header_takes_priorities_0_to_7(priority: int) -> None:
    header = safetext.stream_header(identifier="x", unit="", priority=priority)
    assert header.split(b"\n")[2] == str(priority).encode()


@pytest.mark.parametrize("priority", [-1, 8])
def test_the_stream_header_refuses_priorities_outside_0_to_7(priority: int) -> None:
    with pytest.raises(InvalidArgument):
        safetext.stream_header(identifier="x", unit="", priority=priority)


def test_a_unit_with_a_final_newline_never_shifts_the_stream_header() -> None:
    with pytest.raises(InvalidArgument):
        safetext.stream_header(identifier="x", unit="leviath-a-b-1.scope\n", priority=6)


@pytest.mark.parametrize("key", ["leviath_x\n", "MESSAGE", "message", "PRIORITY",
                                 "syslog_identifier", "_PID", "X" * 65, "a-b", ""])
def test_a_field_name_the_daemon_may_not_set_is_refused(key: str) -> None:
    with pytest.raises(ValueError):
        safetext.journal_fields("m", {key: "v"})


def test_field_names_up_to_64_characters_are_set_and_none_is_left_out() -> None:
    got = safetext.journal_fields("m", {"x" * 64: 0, "y": None, "z": ""})
    assert got == {"MESSAGE": "m", "X" * 64: "0", "Z": ""}


def test_utf8_refuses_invalid_bytes_and_control_characters_and_cuts() -> None:
    assert safetext.utf8("é".encode() * 3, what="x", limit=3) == "ééé"
    assert safetext.utf8(b"abcd", what="x", limit=3) == "ab…"
    for bad in (b"\xff", b"a\nb", b"\x1b[31m"):
        with pytest.raises(InvalidArgument):
            safetext.utf8(bad, what="x", limit=10)
