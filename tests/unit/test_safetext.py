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
