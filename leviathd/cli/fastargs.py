"""The common forms of `lev run`, `lev ps`, `lev stop` and `lev logs` parsed
without argparse, whose import (with re, gettext, locale, shutil) is a good
part of such a command's wall time (issue 18). Only exact option names are
taken here; anything else (an abbreviation, -h, bundled short options, a
value that looks like an option) returns None, and argparse parses the
command as before, with its errors and help. test_cli_fastargs checks that
both parsers agree on every form taken here."""

from __future__ import annotations

# typing imports re; mypy reads any TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class Namespace:
    """What argparse.Namespace offers the commands: attributes."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)

    def __repr__(self) -> str:
        return f"Namespace({self.__dict__!r})"


# command: (flags: option -> dest, valued: option -> (dest, choices or None),
#           positionals in order as (dest, required), defaults)
_Spec = tuple[
    dict[str, str], dict[str, tuple[str, "tuple[str, ...] | None"]],
    tuple[tuple[str, bool], ...], dict[str, object],
]
SPECS: dict[str, _Spec] = {
    "run": (
        {"--detach": "detach", "-d": "detach", "--no-sandbox": "no_sandbox"},
        {"--workdir": ("workdir", None), "-w": ("workdir", None),
         "--workdir-mode": ("workdir_mode", ("rw", "ro", "throwaway"))},
        (("blueprint", False),),
        {"workdir": None, "detach": False, "workdir_mode": "rw", "no_sandbox": False,
         "blueprint": None, "command_argv": None},
    ),
    "ps": ({"--all": "all", "-a": "all", "--json": "json"}, {}, (),
           {"all": False, "json": False}),
    "stop": ({}, {}, (("id", True),), {}),
    "logs": ({"--follow": "follow", "-f": "follow", "--raw": "raw"}, {}, (("id", True),),
             {"follow": False, "raw": False}),
}  # fmt: skip


def _func(command: str) -> Callable[[Any], int]:
    if command == "run":
        from leviathd.cli import run

        return run.main
    from leviathd.cli import control

    return {"ps": control.ps_main, "stop": control.stop_main, "logs": control.logs_main}[
        command
    ]


def parse(argv: list[str]) -> Namespace | None:
    if not argv or argv[0] not in SPECS:
        return None
    command, rest = argv[0], argv[1:]
    flags, valued, positionals, defaults = SPECS[command]
    values: dict[str, object] = dict(defaults)
    if command == "run" and "--" in rest:
        # As main.split_command: what follows the first -- is the command.
        at = rest.index("--")
        rest, values["command_argv"] = rest[:at], rest[at + 1 :]
    wanted = list(positionals)
    i = 0
    while i < len(rest):
        tok = rest[i]
        if tok == "--":
            return None
        if tok.startswith("-") and tok != "-":
            name, eq, inline = tok.partition("=")
            if name in flags and not eq:
                values[flags[name]] = True
                i += 1
                continue
            if name not in valued:
                return None
            dest, choices = valued[name]
            if eq:
                value, i = inline, i + 1
            elif i + 1 < len(rest) and not rest[i + 1].startswith("-"):
                value, i = rest[i + 1], i + 2
            else:
                return None
            if choices is not None and value not in choices:
                return None
            values[dest] = value
            continue
        if not wanted:
            return None  # argparse says what is extra
        values[wanted.pop(0)[0]] = tok
        i += 1
    if any(required for _name, required in wanted):
        return None  # argparse says what is missing
    return Namespace(command=command, func=_func(command), **values)
