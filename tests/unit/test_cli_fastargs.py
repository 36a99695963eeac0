"""cli/fastargs.py parses what it takes exactly as argparse does (and leaves
everything else to argparse)."""

from __future__ import annotations

import pytest

from leviathd.cli import fastargs
from leviathd.cli.main import build_parser

TAKEN = [
    ["run", "--", "true"],
    ["run", "--", "sh", "-c", "echo -d --detach"],
    ["run", "-d", "--", "true"],
    ["run", "--detach", "--workdir", "/w", "--", "make", "test"],
    ["run", "--detach", "--", "make", "--workdir", "x", "--", "-d"],
    ["run", "-w", "/w", "--workdir-mode", "ro", "./bp"],
    ["run", "--workdir=/w x", "--workdir-mode=throwaway", "bp", "--detach"],
    ["run", "my-agent", "--workdir", "/src/app", "--detach"],
    ["run", "-w=/w", "--no-sandbox", "-d", "bp"],
    ["run", "bp"], ["run", "bp", "--", "id"], ["run"], ["run", "--"], ["run", "-"],
    ["run", "--workdir", "", "bp"],
    ["ps"], ["ps", "-a"], ["ps", "--all", "--json"], ["ps", "--json", "--json"],
    ["stop", "abc"], ["stop", "-"],
    ["logs", "abc"], ["logs", "-f", "abc"], ["logs", "abc", "--raw", "--follow"],
]  # fmt: skip

LEFT = [
    ["run", "--det", "--", "true"],  # an abbreviation
    ["run", "-dw", "/w", "--", "true"],  # bundled short options
    ["run", "-w", "-x", "--", "true"],  # a value that looks like an option
    ["run", "--workdir"],
    ["run", "--workdir-mode", "rwx", "bp"],
    ["run", "--detach=yes", "bp"],
    ["run", "one", "two"],
    ["run", "-h"], ["run", "--version"],
    ["ps", "extra"], ["ps", "--help"], ["ps", "--", "x"],
    ["stop"], ["stop", "a", "b"], ["stop", "--", "a"], ["stop", "-5"],
    ["logs", "-x", "a"],
    ["tool", "read_file", "x"], ["policy", "list"], [], ["--version"],
]  # fmt: skip


@pytest.mark.parametrize("argv", TAKEN, ids=" ".join)
def test_the_fast_parser_agrees_with_argparse(argv: list[str]) -> None:
    fast = fastargs.parse(argv)
    assert fast is not None
    first, command = (argv, None) if "--" not in argv else (
        argv[: argv.index("--")], argv[argv.index("--") + 1 :])
    slow = build_parser(argv[0]).parse_args(first)
    if command is not None:
        slow.command_argv = command  # as main.parse does
    assert vars(fast) == vars(slow)


@pytest.mark.parametrize("argv", LEFT, ids=" ".join)
def test_other_forms_are_left_to_argparse(argv: list[str]) -> None:
    assert fastargs.parse(argv) is None
