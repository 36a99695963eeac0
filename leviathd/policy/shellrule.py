"""Allowlist rules for the `shell` tool match a parsed command line, not its
text (issue 21 §6): with a text glob, `git status*` also matched
`git status; curl evil.test`.

A command line is split into words as `sh` would (quotes, backslashes) and
into commands at the operators `;`, `&&`, `||`, `|`, `&`, newline. It matches
a rule only if the line has no redirection (`<`, `>`), no substitution or
expansion (`$`, backquote), no subshell or grouping (`(`, `)`, `{`, `}`), no
globbing the shell would expand (`*`, `?`, `[` outside quotes), no comment,
and exactly the rule's shape: as many commands, joined by the same
operators, each command's words matching the rule's words in order. A rule
word is a glob over one word (`*` any characters, `?` one; it never spans
words); a last rule word that is exactly `*` matches any number of further
words, none included. So `git status *` matches `git status` and
`git status --short`, but not `git status; id` nor `git status $(id)`; a
rule may allow a pipe by writing one: `git log * | head *`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

# Never in a line a rule can match, unless quoted.
_REFUSED_UNQUOTED = set("<>(){}*?[#~")
_OPERATORS = (";", "&&", "||", "|", "&")


@dataclass(frozen=True)
class Parsed:
    commands: tuple[tuple[str, ...], ...]
    operators: tuple[str, ...]


def _glob(word: str) -> re.Pattern[str]:
    out = []
    for ch in word:
        out.append(".*" if ch == "*" else "." if ch == "?" else re.escape(ch))
    return re.compile("".join(out), re.DOTALL)


def parse_line(line: str) -> Parsed | None:
    """The commands and operators of `line`, or None when it holds anything
    a rule cannot vouch for (see the module's doc)."""
    if "$" in line or "`" in line or "\0" in line:
        return None
    commands: list[list[str]] = [[]]
    operators: list[str] = []
    i, n = 0, len(line)
    word: list[str] | None = None
    while i < n:
        ch = line[i]
        if ch in " \t":
            if word is not None:
                commands[-1].append("".join(word))
                word = None
            i += 1
            continue
        op = next((o for o in ("&&", "||") if line.startswith(o, i)), None)
        if op is None and ch in ";|&\n":
            op = ";" if ch == "\n" else ch
        if op is not None:
            if word is not None:
                commands[-1].append("".join(word))
                word = None
            if not commands[-1]:
                return None  # an operator with no command before it
            operators.append(op)
            commands.append([])
            i += len(op) if op in ("&&", "||") else 1
            continue
        if ch in _REFUSED_UNQUOTED:
            return None
        word = word if word is not None else []
        if ch == "\\":
            if i + 1 >= n or line[i + 1] == "\n":
                return None
            word.append(line[i + 1])
            i += 2
        elif ch == "'":
            end = line.find("'", i + 1)
            if end < 0:
                return None
            word.append(line[i + 1:end])
            i = end + 1
        elif ch == '"':
            end = i + 1
            chunk: list[str] = []
            while end < n and line[end] != '"':
                if line[end] == "\\" and end + 1 < n and line[end + 1] in '"\\':
                    chunk.append(line[end + 1])
                    end += 2
                    continue
                chunk.append(line[end])
                end += 1
            if end >= n:
                return None
            word.append("".join(chunk))
            i = end + 1
        else:
            word.append(ch)
            i += 1
    if word is not None:
        commands[-1].append("".join(word))
    if not commands[-1]:
        if operators and operators[-1] == ";":
            operators.pop()  # a trailing `;` or newline ends the line
            commands.pop()
        else:
            return None
    if not commands or not commands[0]:
        return None
    return Parsed(tuple(tuple(c) for c in commands), tuple(operators))


class ShellPattern:
    """A rule's target for `shell`, compiled."""

    def __init__(self, text: str) -> None:
        self.text = text
        lex = shlex.shlex(text, posix=True, punctuation_chars=";&|")
        lex.whitespace_split = True
        lex.commenters = ""
        commands: list[list[str]] = [[]]
        operators: list[str] = []
        for tok in lex:
            if tok in _OPERATORS:
                operators.append(tok)
                commands.append([])
            else:
                commands[-1].append(tok)
        if any(not c for c in commands):
            raise ValueError(f"shell rule {text!r}: an operator with no command beside it")
        self.operators = tuple(operators)
        self.commands = tuple(tuple(_glob(w) for w in c) for c in commands)
        self.rest = tuple(bool(c) and c[-1] == "*" for c in commands)

    def matches(self, line: str) -> bool:
        parsed = parse_line(line)
        if parsed is None or parsed.operators != self.operators:
            return False
        return all(
            _words(words, pattern, rest)
            for words, pattern, rest in zip(parsed.commands, self.commands, self.rest,
                                            strict=True)
        )


def _words(words: Sequence[str], pattern: Sequence[re.Pattern[str]], rest: bool) -> bool:
    fixed = pattern[:-1] if rest else pattern
    if len(words) < len(fixed) or (not rest and len(words) != len(fixed)):
        return False
    return all(p.fullmatch(w) for p, w in zip(fixed, words, strict=False))
