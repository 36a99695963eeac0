"""Files and folders that git settings name, for protected.py: a setting in a
protected config (`.git/config`, the user's `~/.gitconfig`) that points into
the workdir hands the agent a way to run code at the user's next `git` on
the host, unless what it points at is read-only too (issue 31: husky's
`core.hooksPath = .husky`, an `include.path` to a workdir file).

Covered (docs/sandbox.md, "Protected paths"):
- `core.hooksPath`: the folder (relative: to the working tree's top);
- `include.path`, `includeIf.<cond>.path`: the file (relative: to the
  including file's folder), and the settings in it, read in turn;
- commands: `core.fsmonitor` (unless a boolean), `core.sshCommand`,
  `core.editor`, `sequence.editor`, `core.pager`, `core.askPass`,
  `diff.external`, `gpg.program`, `gpg.<format>.program`,
  `credential.helper` and `credential.<url>.helper`,
  `filter.<d>.clean|smudge|process`, `diff.<d>.textconv|command`,
  `merge.<d>.driver`, `alias.<name>` (a `!` shell alias), `pager.<cmd>`:
  every word of the command line that names a path (has a `/`);
- `core.attributesFile` (which picks filters for paths), `core.excludesFile`
  is not (it runs nothing).

Pure: the caller reads the files (as the user); a parse is bounded in size,
includes and depth.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MAX_INCLUDES = 16
MAX_DEPTH = 5
MAX_TEXT = 1 << 20
MAX_SETTINGS = 4096

_SECTION = re.compile(r'^\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]\s*(.*)$')
_KEY = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*(?:=\s*(.*))?$")
_FALSE_TRUE = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0", ""})

# (section, key) of command settings; "*" a subsection (a driver's or url's name).
_COMMANDS = frozenset({
    ("core", "fsmonitor"), ("core", "sshcommand"), ("core", "editor"), ("sequence", "editor"),
    ("core", "pager"), ("core", "askpass"), ("diff", "external"), ("gpg", "program"),
    ("gpg.*", "program"), ("credential", "helper"), ("credential.*", "helper"),
    ("filter.*", "clean"), ("filter.*", "smudge"), ("filter.*", "process"),
    ("diff.*", "textconv"), ("diff.*", "command"), ("merge.*", "driver"),
})
_COMMAND_SECTIONS = frozenset({"alias", "pager"})


@dataclass(frozen=True)
class Named:
    """A path a setting names: `folder` for a hooks folder, `why` the setting."""

    path: str
    folder: bool
    why: str


def parse(text: str) -> list[tuple[str, str, str]]:
    """(section[.subsection], key, value) of a git config text, keys lower
    case, values unquoted; what cannot be read is skipped (git would refuse
    the file, so it sets nothing)."""
    out: list[tuple[str, str, str]] = []
    section = ""
    lines = text[:MAX_TEXT].split("\n")
    i = 0
    while i < len(lines) and len(out) < MAX_SETTINGS:
        line = lines[i]
        i += 1
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + lines[i]
            i += 1
        m = _SECTION.match(line)
        if m is not None:
            name, sub, rest = m.group(1).lower(), m.group(2), m.group(3)
            section = f"{name}.{sub.replace(chr(92), '')}" if sub is not None else name
            line = rest
            if not line.strip():
                continue
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        k = _KEY.match(line)
        if k is None or not section:
            continue
        out.append((section, k.group(1).lower(), _value(k.group(2) or "")))
    return out


def _value(raw: str) -> str:
    """A value as git reads it: quotes removed, escapes applied, a comment
    (# or ; outside quotes) cut."""
    out: list[str] = []
    quoted = False
    j = 0
    while j < len(raw):
        c = raw[j]
        if c == '"':
            quoted = not quoted
        elif c == "\\" and j + 1 < len(raw):
            j += 1
            out.append({"n": "\n", "t": "\t", "b": "\b"}.get(raw[j], raw[j]))
        elif c in "#;" and not quoted:
            break
        else:
            out.append(c)
        j += 1
    return "".join(out).strip()


def _expand(value: str, home: str, base: str) -> str:
    if value.startswith("~/"):
        return posixpath.normpath(posixpath.join(home, value[2:]))
    return posixpath.normpath(posixpath.join(base, value))


def _command_paths(command: str, home: str, top: str) -> list[str]:
    """The words of a command line that name paths (have a '/'; an alias's
    leading '!' removed), resolved against the working tree's top."""
    text = command[1:] if command.startswith("!") else command
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    out = []
    for word in words[:64]:
        for part in word.split("=", 1)[-1:]:  # --opt=./x names ./x
            if "/" in part and not part.startswith("-") and "://" not in part:
                out.append(_expand(part, home, top))
    return out


def _is_command(section: str, key: str) -> bool:
    if section in _COMMAND_SECTIONS:
        return True
    if (section, key) in _COMMANDS:
        return True
    head = section.split(".", 1)[0]
    return "." in section and (f"{head}.*", key) in _COMMANDS


def named_paths(
    configs: Iterable[str], *, home: str, top: str, read_text: Callable[[str], str | None],
) -> list[Named]:
    """What the settings of these config files (and the files they include)
    name, as absolute paths; `top` is the working tree's top folder."""
    found: list[Named] = []
    todo = [(c, 0) for c in configs]
    seen: set[str] = set()
    includes = 0
    while todo:
        path, depth = todo.pop(0)
        if path in seen:
            continue
        seen.add(path)
        text = read_text(path)
        if text is None:
            continue
        for section, key, value in parse(text):
            if not value:
                continue
            name = f"{section}.{key}"
            if (section == "include" or section.startswith("includeif.")) and key == "path":
                target = _expand(value, home, posixpath.dirname(path))
                found.append(Named(target, False, f"git: {name} names it"))
                includes += 1
                if depth < MAX_DEPTH and includes <= MAX_INCLUDES:
                    todo.append((target, depth + 1))
            elif section == "core" and key == "hookspath":
                found.append(Named(_expand(value, home, top), True, f"git: {name} names it"))
            elif section == "core" and key == "attributesfile":
                found.append(Named(_expand(value, home, top), False, f"git: {name} names it"))
            elif _is_command(section, key):
                if section == "core" and key == "fsmonitor" and value.lower() in _FALSE_TRUE:
                    continue
                if section in _COMMAND_SECTIONS and section == "alias" \
                        and not value.startswith("!"):
                    continue
                for p in _command_paths(value, home, top):
                    found.append(Named(p, False, f"git: {name} runs it"))
    return found
