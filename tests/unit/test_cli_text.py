"""leviathd.cli.text: what reaches a terminal from strings an agent chose."""

from __future__ import annotations

from leviathd.cli.text import OutputFilter, field, lines


def test_field_escapes_every_control_character_and_doubles_backslashes() -> None:
    assert field("a\x1b]0;t\x07b") == "a\\x1b]0;t\\x07b"
    assert field("x\ny\tz\r") == "x\\x0ay\\x09z\\x0d"
    assert field("\x9b31m") == "\\x9b31m"  # C1 CSI
    assert field("abc\u202eevil") == "abc\\u202eevil"  # bidi override
    assert field("c:\\x1b") == "c:\\\\x1b"  # a typed "\x1b" is not an escape
    assert field("plain /home/ä") == "plain /home/ä"


def test_lines_keeps_newlines_and_tabs() -> None:
    assert lines("a\tb\nc\x1b[2J") == "a\tb\nc\\x1b[2J"


def test_output_filter_handles_split_utf8_and_bad_bytes() -> None:
    f = OutputFilter()
    out = f.feed("ä".encode()[:1]) + f.feed("ä".encode()[1:] + b"\x1b[31m\xff\n", final=True)
    assert out == "ä\\x1b[31m\\xff\n".encode()
