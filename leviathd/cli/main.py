"""`lev`: the command-line client. Each subcommand lives in its own module and
registers itself; this file only dispatches and turns errors into one line."""

from __future__ import annotations

import sys

# typing imports re; mypy reads any TYPE_CHECKING as true. Imports are made
# where a command needs them: a short command's wall time is mostly the
# interpreter's start-up and its imports (issue 18; test_cli_imports keeps
# the lists of `lev tool`, `lev run` and `lev ps` honest).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any


# Each module exposes `register(subparsers) -> None`; the parser it adds sets
# `func(args) -> int` as its default.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "leviathd.cli.validate",
    "leviathd.cli.store",
    "leviathd.cli.run",
    "leviathd.cli.control",
    "leviathd.cli.tool",
    "leviathd.cli.mcp",
    "leviathd.cli.policy",
    "leviathd.cli.inspect",
    "leviathd.cli.approvals",
    "leviathd.cli.audit",
    "leviathd.cli.connect",
    "leviathd.cli.folders",
)


# Which module registers a command, so that `lev run` imports only what `run`
# needs (startup time is most of a short agent's wall time). A command missing
# here still works: then every module is loaded.
COMMAND_MODULES: dict[str, str] = {
    "run": "leviathd.cli.run",
    "ps": "leviathd.cli.control",
    "stop": "leviathd.cli.control",
    "stats": "leviathd.cli.control",
    "logs": "leviathd.cli.control",
    "inspect": "leviathd.cli.inspect",
    "tool": "leviathd.cli.tool",
    "mcp": "leviathd.cli.mcp",
    "policy": "leviathd.cli.policy",
    "approvals": "leviathd.cli.approvals",
    "approve": "leviathd.cli.approvals",
    "audit": "leviathd.cli.audit",
    "connect": "leviathd.cli.connect",
    "folder": "leviathd.cli.folders",
    "restart": "leviathd.cli.folders",
}


# How `lev --help` lists the commands; one missing here shows under "other".
GROUPS: dict[str, tuple[str, ...]] = {
    "running agents": ("run", "ps", "stop", "restart", "logs", "inspect", "stats"),
    "agent store": ("add", "list", "validate", "folder"),
    "policy": ("policy", "approvals", "approve", "audit"),
    "inside an agent": ("tool", "mcp", "connect"),
}


def _grouped(sub: argparse._SubParsersAction[Any]) -> str:
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    width = max(map(len, helps), default=0) + 2
    listed: set[str] = set()
    out = []
    for title, names in [*GROUPS.items(), ("other", tuple(helps))]:
        rows = [n for n in names if n in helps and n not in listed]
        if rows:
            out.append(f"{title}:")
            out += [f"  {n:<{width}}{helps[n]}" for n in rows]
            out.append("")
            listed.update(rows)
    return "\n".join(out)


def _lev_parser_class() -> type[argparse.ArgumentParser]:
    import argparse

    class _LevParser(argparse.ArgumentParser):
        """`lev --help` lists the commands by group (the epilog) instead of
        argparse's one flat list; the parser itself, which packaging/gen_docs.py
        reads for the man pages, keeps every command's help line."""

        def format_help(self) -> str:
            subs = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
            saved = [a._choices_actions for a in subs]
            for a in subs:
                a._choices_actions = []
            try:
                return super().format_help()
            finally:
                for a, kept in zip(subs, saved, strict=True):
                    a._choices_actions = kept

    return _LevParser


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    import argparse
    import importlib

    from leviathd import __version__

    parser = _lev_parser_class()(
        prog="lev", description="Run and inspect fenced AI agents (leviathd).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lev {__version__}")
    # Taken before parsing (cli/remote.py); here for --help and the man page.
    parser.add_argument("-H", "--host", metavar="[USER@]HOST", default=argparse.SUPPRESS,
                        help="the leviathd of another machine, over ssh to its system bus "
                        "(as systemctl -H; ps, stop and stats only)")
    parser.add_argument("-M", "--machine", metavar="MACHINE", default=argparse.SUPPRESS,
                        help="the leviathd of a local container (as systemctl -M; ps, stop "
                        "and stats only)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                title="commands", help="one of the commands listed below")
    wanted = COMMAND_MODULES.get(command or "")
    for name in (wanted,) if wanted else SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # A command left out of this build must not take the others down.
            if exc.name != name:
                raise
            continue
        module.register(sub)
    parser.epilog = (f"{_grouped(sub)}\n"
                     "`lev COMMAND --help` tells more; docs/cli.md has them all.")
    return parser


# Commands whose output is not for a person's terminal as text: `tool` and
# `mcp` speak to the agent that runs them (JSON or the tool's own result),
# `logs` filters the agent's output itself (and passes it raw with --raw).
_UNFILTERED = frozenset({"tool", "mcp", "logs"})


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`lev run [options] [BLUEPRINT] -- COMMAND...`: what follows the first
    `--` is the agent's command, left out of parsing, so that options may
    stand anywhere before it and nothing after it is taken for one."""
    if "--" not in argv:
        return argv, None
    at = argv.index("--")
    return argv[:at], argv[at + 1:]


def parse(argv: list[str]) -> argparse.Namespace:
    from leviathd.cli import fastargs

    fast: Any = fastargs.parse(argv)
    if fast is not None:
        return fast  # type: ignore[no-any-return]
    first = next((a for a in argv if not a.startswith("-")), None)
    command_argv = None
    if first == "run":
        argv, command_argv = split_command(argv)
    args = build_parser(first).parse_args(argv)
    if command_argv is not None:
        args.command_argv = command_argv
    return args


# Commands after which the process ends at once (see _exit_now).
_QUICK_EXIT = frozenset({"run", "ps", "stop"})


def _exit_now(rc: int) -> None:
    """Ends the process once the output is flushed, without the
    interpreter's shutdown (the modules' and the garbage collector's clean-
    up: ~2 ms of a short command, issue 18, of no use to one that is done).
    A flush that fails leaves the usual exit to report it."""
    import os

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(rc)


def main(argv: Sequence[str] | None = None) -> int:
    program = argv is None  # not when a test calls main() in its own process
    argv = list(sys.argv[1:] if argv is None else argv)
    from leviathd.cli import lazysite

    lazysite.install()
    if argv[:1] == ["tool"]:
        from leviathd.cli import toolfast

        try:
            fast = toolfast.main(argv[1:])
        except KeyboardInterrupt:
            return 130
        if fast is not None:
            return fast
    import io

    from leviathd.cli import text
    from leviathd.cli.text import EscapingStream
    from leviathd.errors import LeviathError

    if argv[:1] and argv[0].split("=", 1)[0] in ("-H", "--host", "-M", "--machine"):
        from leviathd.cli import remote, wire

        try:
            argv, wire.BRIDGE, wire.BRIDGE_TARGET = remote.split(argv)
        except remote.RemoteError as exc:
            print(f"lev: {text.field(str(exc))}", file=sys.stderr)
            return 2
    args = parse(argv)
    if args.command not in _UNFILTERED and isinstance(sys.stdout, io.TextIOWrapper):
        # Whatever a command prints may hold strings an agent chose.
        sys.stdout = EscapingStream(sys.stdout)
    if isinstance(sys.stderr, io.TextIOWrapper):
        sys.stderr = EscapingStream(sys.stderr)
    try:
        rc: int = args.func(args)
    except LeviathError as exc:
        # One line: the message may quote what an agent chose (a target, a name).
        print(f"lev: {text.field(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    if program and args.command in _QUICK_EXIT:
        _exit_now(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
