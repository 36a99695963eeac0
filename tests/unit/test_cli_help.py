"""`lev --help` reads well to a newcomer: every subcommand and argument has a
help line, and the subcommands are listed in groups, one line each."""

from __future__ import annotations

import argparse

import pytest

from leviathd.cli.main import GROUPS, build_parser, main


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = sub
                found.update({f"{name} {k}": v for k, v in _subparsers(sub).items()})
    return found


def test_every_subcommand_and_argument_has_a_help_line() -> None:
    parser = build_parser()
    missing = []
    for name, sub in _subparsers(parser).items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"lev {name} {c.dest}" for c in action._choices_actions if not c.help]
            elif not action.help:
                missing.append(f"lev {name} {action.dest}")
    assert not missing, missing
    top = {a.dest: a for a in parser._actions}
    choices = top["command"]
    assert isinstance(choices, argparse._SubParsersAction)
    for name in choices.choices:
        assert any(name in names for names in GROUPS.values()), f"lev {name} is in no group"


def test_lev_help_lists_subcommands_grouped_one_line_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for title in ("running agents:", "agent store:", "policy:", "inside an agent:"):
        assert title in out
    for line in out.splitlines():
        if line.startswith("  ") and line.split()[0] in ("run", "ps", "tool", "add"):
            assert len(line.split()) > 2, line  # the command and its help on one line
    assert out.index("running agents:") < out.index("  run ") < out.index("agent store:")


def test_lev_version(capsys: pytest.CaptureFixture[str]) -> None:
    from leviathd import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"lev {__version__}"


def test_leviathd_help_and_version_print_and_exit(capsys: pytest.CaptureFixture[str]) -> None:
    from leviathd import __version__, daemon

    with pytest.raises(SystemExit) as e:
        daemon.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"leviathd {__version__}"
    with pytest.raises(SystemExit) as e:
        daemon.main(["--help"])
    assert e.value.code == 0 and "usage: leviathd" in capsys.readouterr().out


def test_lev_tool_outside_an_agent_says_where_it_works(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object,
) -> None:
    from leviathd.cli import tool

    monkeypatch.delenv("LEVIATH_BROKER", raising=False)
    monkeypatch.setattr(tool, "DEFAULT_SOCKET", f"{tmp_path}/absent.sock")
    for argv in (["tool", "read_file", "x"], ["mcp"]):
        assert main(argv) != 0
        err = capsys.readouterr().err
        assert "work only inside an agent" in err and "lev run -- lev tool" in err, err


def test_testbed_shell_header_points_at_a_file_in_the_repo() -> None:
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    header = (repo / "scripts/testbed-shell").read_text().split("set -eu")[0]
    named = re.findall(r"see ([\w./-]+\.md)", header)
    assert named and all((repo / n).is_file() for n in named), named
