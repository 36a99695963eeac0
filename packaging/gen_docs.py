"""Man pages and bash completion for `lev` and `leviathd`, generated from the
argparse parser that `lev --help` prints, so they cannot drift from it:
tests/unit/test_packaging_docs.py fails when the files in packaging/man/ and
packaging/completion/ differ from what this produces.

    python3 packaging/gen_docs.py          # rewrite them after changing the CLI
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
os.environ["COLUMNS"] = "80"  # argparse wraps usage lines at the terminal's width

from leviathd import __version__  # noqa: E402
from leviathd.cli.main import build_parser  # noqa: E402

DATE = "2026-11-30"
SOURCE = f"leviathd {__version__}"


def _esc(text: str) -> str:
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + ln if ln[:1] in (".", "'") else ln) for ln in text.splitlines())


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, helps.get(name, ""), sp) for name, sp in action.choices.items()]
    return []


def _options(parser: argparse.ArgumentParser) -> str:
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction) or a.help == argparse.SUPPRESS:
            continue
        if isinstance(a, argparse._SubParsersAction):
            for name, help_, _sp in _subcommands(parser):
                out.append(f".TP\n\\fB{_esc(name)}\\fR\n{_esc(help_)}")
            continue
        metavar = a.metavar if isinstance(a.metavar, str) else a.dest.upper()
        if a.choices and not isinstance(a.metavar, str):
            metavar = "{" + ",".join(map(str, a.choices)) + "}"
        if a.option_strings:
            takes = a.nargs != 0
            names = ", ".join(
                f"\\fB{_esc(o)}\\fR" + (f" \\fI{_esc(metavar)}\\fR" if takes else "")
                for o in a.option_strings
            )
        else:
            names = f"\\fI{_esc(metavar)}\\fR"
        out.append(f".TP\n{names}\n{_esc(a.help or '')}")
    return "\n".join(out)


def _page(name: str, section: int, summary: str, usage: str, description: str,
          body: str, see_also: list[str]) -> str:
    parts = [
        f'.TH {_esc(name.upper())} {section} "{DATE}" "{SOURCE}" "leviathd manual"',
        ".SH NAME", f"{_esc(name)} \\- {_esc(summary)}",
        ".SH SYNOPSIS", ".nf", _esc(usage.strip().removeprefix("usage: ")), ".fi",
    ]
    if description:
        parts += [".SH DESCRIPTION", _esc(description)]
    if body:
        parts += [body]
    parts += [".SH SEE ALSO", ", ".join(f"\\fB{_esc(s)}\\fR" for s in see_also),
              "", "/usr/share/doc/leviathd/cli.md and configuration.md."]
    return "\n".join(parts) + "\n"


def man_pages() -> dict[str, str]:
    parser = build_parser()
    subs = _subcommands(parser)
    pages = {}
    see = [f"lev-{n}(1)" for n, _h, _sp in subs] + ["leviathd(8)"]
    pages["lev.1"] = _page(
        "lev", 1, "run and inspect fenced AI agents (leviathd)", parser.format_usage(),
        (parser.description or "") + "\n.PP\nEach command has its own page, "
        "lev\\-COMMAND(1), and prints the same text with \\fBlev COMMAND \\-\\-help\\fR.",
        ".SH COMMANDS\n" + _options(parser), see)
    for name, help_, sp in subs:
        pages[f"lev-{name}.1"] = _page(
            f"lev-{name}", 1, help_ or f"the {name} command of lev", sp.format_usage(),
            sp.description or "", ".SH OPTIONS\n" + _options(sp), ["lev(1)"])
    pages["leviathd.8"] = _page(
        "leviathd", 8, "the leviathd service: fenced AI agents, one systemd scope each",
        "leviathd [--help] [--version]", "The system service behind lev(1). It takes no "
        "arguments but --help and --version, refuses to start when not root, and is "
        "started by systemd (leviathd.service, or by D-Bus activation of "
        "org.leviath.Manager1), runs as root, and owns org.leviath.Manager1 on the system "
        "bus; polkit decides who may do what. Configuration: /etc/leviath/config.toml, "
        "re-read when it changes (watched from before the daemon reports ready) and on "
        "systemctl reload leviathd.",
        ".SH FILES\n.TP\n/etc/leviath/config.toml\nthe machine's configuration (optional)\n"
        ".TP\n/var/lib/leviath\nagents' records and scratch folders\n"
        ".TP\n/run/leviath\nper-agent broker sockets",
        ["lev(1)", "systemctl(1)", "journalctl(1)", "pkaction(1)"])
    return pages


def completion() -> str:
    parser = build_parser()
    cases = []
    names = []
    for name, _h, sp in _subcommands(parser):
        names.append(name)
        opts = sorted(o for a in sp._actions for o in a.option_strings)
        choices = [
            f"        {'|'.join(a.option_strings)}) COMPREPLY=($(compgen -W "
            f"\"{' '.join(map(str, a.choices))}\" -- \"$cur\")); return ;;"
            for a in sp._actions if a.option_strings and a.choices
        ]
        dirs = [o for a in sp._actions for o in a.option_strings if a.dest == "workdir"]
        if dirs:
            choices.append(f"        {'|'.join(dirs)}) COMPREPLY=($(compgen -d -- \"$cur\")); "
                           "return ;;")
        inner = "\n".join(choices)
        cases.append(
            f"    {name})\n"
            + (f"        case $prev in\n{inner}\n        esac\n" if inner else "")
            + f"        COMPREPLY=($(compgen -W \"{' '.join(opts)}\" -- \"$cur\"))\n"
            "        [ ${#COMPREPLY[@]} -gt 0 ] || COMPREPLY=($(compgen -f -- \"$cur\"))\n"
            "        ;;"
        )
    return (
        "# bash completion for lev (leviathd), generated by packaging/gen_docs.py from\n"
        "# the parser behind `lev --help`; do not edit.\n"
        "_lev() {\n"
        "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd= i\n"
        "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
        "        [ \"${COMP_WORDS[i]}\" = -- ] && return\n"
        "        case ${COMP_WORDS[i]} in -*) ;; *) cmd=${COMP_WORDS[i]}; break ;; esac\n"
        "    done\n"
        "    if [ -z \"$cmd\" ]; then\n"
        f"        COMPREPLY=($(compgen -W \"{' '.join(names)} --help\" -- \"$cur\"))\n"
        "        return\n"
        "    fi\n"
        "    case $cmd in\n" + "\n".join(cases) + "\n    esac\n"
        "}\n"
        "complete -F _lev lev\n"
    )


def outputs() -> dict[Path, str]:
    out = {HERE / "man" / name: text for name, text in man_pages().items()}
    out[HERE / "completion" / "lev"] = completion()
    return out


if __name__ == "__main__":
    for path, text in outputs().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for stale in (HERE / "man").glob("*"):
        if stale not in outputs():
            stale.unlink()
