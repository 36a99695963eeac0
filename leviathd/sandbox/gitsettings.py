"""Files and folders that git settings name, for protected.py (issues 31, 48):
a setting that points into a folder the agent may write hands it a way to
run code at the user's next `git` on the host, unless what it points at is
read-only too (husky's `core.hooksPath`, an `include.path` to a workdir file,
a `!` alias running `./x.sh`).

The settings are git's own answer (sandbox/gitask.py); each key is
classified by the table in sandbox/gitkeys.py. What a value names is
resolved by git's rules:
- every file git read settings from (an include in the workdir, a
  `~/.gitconfig` that links into a dotfiles folder) and every file an
  include names, whether its condition holds now or not;
- a folder key (`core.hooksPath`, `init.templateDir`): the folder, a
  relative one against the working tree's top;
- a command key: every word of the command line the shell could run or
  read as a file: a word with a `/` (relative: to the working tree's top,
  where git runs hooks, aliases and drivers), or a bare word that is a file
  at the top (`sh x.sh`; a bare word naming a folder, `make test`, is
  not). A word the shell would expand (`$VAR`, a glob, `$(...)`) cannot be
  read safely: the deepest folder it surely lies in is protected
  whole (`$HOME` and `~` are the user's home).

Pure: the caller asked git, and answers whether a path is a regular file.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from leviathd.sandbox import gitkeys
from leviathd.sandbox.gitask import GitView, include_target

MAX_WORDS = 128
_FALSE_TRUE = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0", ""})
_OPERATORS = frozenset(";&|(){}<>`\n")
_UNSAFE = frozenset("$*?[`")


@dataclass(frozen=True)
class Named:
    """A path a setting names: `folder` when it is a folder, `why` the setting."""

    path: str
    folder: bool
    why: str


def shell_words(command: str, home: str) -> list[tuple[str, bool]]:
    """(word, readable) for each word of a shell command line: quotes
    removed, split at blanks and the shell's operators; `readable` is False
    when the shell would expand something in it that we cannot know
    (`$VAR` but `$HOME`, `${HOME}`; an unquoted glob; a command
    substitution), the word then cut just before that."""
    words: list[tuple[str, bool]] = []
    cur: list[str] = []
    readable = True
    quote = ""
    i = 0

    def end() -> None:
        nonlocal cur, readable
        if cur or not readable:
            words.append(("".join(cur), readable))
        cur, readable = [], True

    text = command
    while i < len(text) and len(words) < MAX_WORDS:
        c = text[i]
        if quote == "'":
            if c == "'":
                quote = ""
            elif readable:
                cur.append(c)
        elif c == "\\" and i + 1 < len(text):
            i += 1
            if readable:
                cur.append(text[i])
        elif c == '"':
            quote = "" if quote == '"' else '"'
        elif c == "'" and not quote:
            quote = "'"
        elif c == "$":
            for name in ("${HOME}", "$HOME"):
                if text.startswith(name, i) and not (
                    name == "$HOME" and text[i + 5 : i + 6].isalnum()
                ):
                    if readable:
                        cur.append(home)
                    i += len(name)
                    break
            else:
                readable = False
                i += 1
            continue
        elif not quote and (c.isspace() or c in _OPERATORS):
            end()
            if c == "`":
                readable = True
        elif not quote and c in _UNSAFE:
            readable = False
        elif c == "~" and not quote and not cur and readable \
                and text[i + 1 : i + 2] in ("/", ""):  # fmt: skip
            cur.append(home)
        elif readable:
            cur.append(c)
        i += 1
    end()
    return words


def _resolve(word: str, bases: Iterable[str]) -> list[str]:
    if word.startswith("/"):
        return [posixpath.normpath(word)]
    return [posixpath.normpath(posixpath.join(b, word)) for b in bases]


def command_paths(
    command: str, *, home: str, bases: list[str], is_file: Callable[[str], bool],
) -> list[Named]:
    """What the words of a command line could run or read (see the module's
    doc); `bases` the folders a relative word is relative to."""
    text = command[1:] if command.startswith("!") else command
    out: list[Named] = []
    words = shell_words(text, home)
    # a quoted script given to a shell (`sh -c "./a b"`): its words too
    words += [w for word, ok in words if ok and " " in word for w in shell_words(word, home)]
    for word, readable in words[:MAX_WORDS]:
        if "://" in word:
            continue  # a URL
        # `--opt=./x`, `VAR=./x`, `PATH=./bin:$PATH` name ./x, ./bin
        parts = word.replace("=", ":").split(":")
        for n, part in enumerate(parts):
            if not readable and n == len(parts) - 1:
                # cut before an expansion: the folder it surely lies in, whole
                folder = part.rsplit("/", 1)[0] if "/" in part else ""
                if folder:
                    out += [Named(p, True, "") for p in _resolve(folder, bases)]
            elif "/" in part:
                out += [Named(p, False, "") for p in _resolve(part, bases)]
            elif part and not part.startswith("-"):
                out += [Named(p, False, "") for p in _resolve(part, bases[:1]) if is_file(p)]
    return out


def _common_base(view: GitView) -> list[str]:
    # git runs hooks, aliases and its drivers at the working tree's top
    return [view.top or view.asked]


def named_paths(
    views: Iterable[GitView], *, home: str, is_file: Callable[[str], bool],
) -> list[Named]:
    """What the settings git reads for these folders name, as absolute paths."""
    found: list[Named] = []
    for view in views:
        bases = _common_base(view)
        for s in view.settings:
            if s.origin is not None:
                found.append(Named(s.origin, False, "git: reads its settings"))
            target = include_target(s, home)
            if target is not None:
                found.append(Named(target, False, f"git: {s.key} names it"))
                continue
            if not s.value:
                continue
            kind = gitkeys.classify(s.key)
            why = f"git: {s.key[:200]} names it"
            if kind in ("path", "folder"):
                value = s.value
                base = bases
                if s.key.lower().startswith("submodule.") and view.common_dir:
                    base = [posixpath.join(view.common_dir, "modules")]
                if value.startswith("~/"):
                    value = posixpath.join(home, value[2:])
                for p in _resolve(value, base):
                    found.append(Named(p, kind == "folder", why))
                    if kind == "folder" and posixpath.basename(p) == "_":
                        # husky 9: `_/<hook>` runs `../<hook>`, the files it keeps
                        found.append(Named(posixpath.dirname(p), True, why))
            elif kind == "command":
                if s.key.lower() == "core.fsmonitor" and s.value.lower() in _FALSE_TRUE:
                    continue
                for n in command_paths(s.value, home=home, bases=bases, is_file=is_file):
                    found.append(Named(n.path, n.folder, f"git: {s.key[:200]} runs it"))
    return list({(n.path, n.folder): n for n in found}.values())
