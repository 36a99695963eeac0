"""Files that the agent tools' settings name as things to run, for
protected.py (issue 45): a hook in `~/.claude/settings.json` (read-only
inside) that runs `~/.claude/hooks/check.sh`, a Codex `notify` or an MCP
server's command naming a script in `~/.codex`, would hand an agent a way to
run code at the user's next `claude` or `codex` on the host, unless what it
names is read-only too.

Read: the settings under a key that says it runs something (`hooks`,
`statusLine`, `apiKeyHelper`, `mcpServers`/`mcp_servers`, `notify`, a
`command`, `args`...), every string beneath it, every word of it that is a
path (`/...`, `~/...`, `$HOME/...`, `$CLAUDE_PROJECT_DIR/...`,
`$GEMINI_PROJECT_DIR/...`). Only what lies inside the tools' state folders
(`~/.claude`, `~/.codex`, `~/.gemini`; never a folder itself, which must
stay writable) is returned: a script the project's own settings name in the
workdir is the project's (docs/sandbox.md's limits).

Pure: the caller reads the files (as the user); bounded in size and count.
"""

from __future__ import annotations

import json
import posixpath
import re
import tomllib
from collections.abc import Callable, Iterator
from typing import Any

MAX_TEXT = 4 << 20
MAX_STRINGS = 4096
MAX_NAMED = 64
MAX_DEPTH = 16

# Relative to the home ("~/") or to the workdir.
SETTINGS: tuple[str, ...] = (
    "~/.claude/settings.json",
    "~/.claude/settings.local.json",
    "~/.claude.json",
    "~/.codex/config.toml",
    "~/.codex/hooks.json",
    "~/.gemini/settings.json",
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".codex/config.toml",
    ".gemini/settings.json",
)

# A key under which strings are commands or their arguments.
_RUNS = re.compile(r"hook|command|notify|helper|mcp|statusline|server|script|program|"
                   r"instruction|args|discovery|refresh|export|suggestion", re.IGNORECASE)
_WORD = re.compile(r"""[^\s'"`;|&()<>=,]+""")
_PROJECT_VARS = ("CLAUDE_PROJECT_DIR", "GEMINI_PROJECT_DIR")
# What is returned lies inside one of these (never one itself: made
# read-only, it would stop the tool).
_TOOL_FOLDERS = (".claude", ".codex", ".gemini")


def _strings(value: Any, running: bool, depth: int = 0) -> Iterator[str]:
    if depth > MAX_DEPTH:
        return
    if isinstance(value, str):
        if running:
            yield value
    elif isinstance(value, dict):
        for key, sub in value.items():
            yield from _strings(sub, running or bool(_RUNS.search(str(key))), depth + 1)
    elif isinstance(value, list):
        for sub in value:
            yield from _strings(sub, running, depth + 1)


def _expand(word: str, home: str, workdir: str) -> str | None:
    for var in ("HOME", *_PROJECT_VARS):
        for form in (f"${var}", f"${{{var}}}"):
            if word == form or word.startswith(form + "/"):
                base = home if var == "HOME" else workdir
                return posixpath.normpath(base + word[len(form):])
    if word == "~" or word.startswith("~/"):
        return posixpath.normpath(home + word[1:])
    if word.startswith("/"):
        return posixpath.normpath(word)
    return None


def _inside(path: str, parent: str) -> bool:
    parent = parent.rstrip("/") or "/"
    return path == parent or path.startswith(parent + "/")


def _parse(path: str, text: str) -> Any:
    try:
        if path.endswith(".toml"):
            return tomllib.loads(text)
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def named_paths(home: str, workdir: str, read_text: Callable[[str], str | None]) -> list[str]:
    """Paths the tools' settings name as things to run, inside the tools'
    state folders, at most MAX_NAMED, each once."""
    home, workdir = posixpath.normpath(home), posixpath.normpath(workdir)
    folders = [posixpath.join(home, f) for f in _TOOL_FOLDERS]
    out: dict[str, None] = {}
    seen = 0
    for rel in SETTINGS:
        where = posixpath.join(home, rel[2:]) if rel.startswith("~/") else (
            posixpath.join(workdir, rel))
        text = read_text(where)
        if text is None or len(text) > MAX_TEXT:
            continue
        data = _parse(where, text)
        if data is None:
            continue
        # ~/.claude.json holds history and projects too: only its MCP servers
        # (global and per project) name commands.
        if rel == "~/.claude.json" and isinstance(data, dict):
            projects = data.get("projects")
            data = {"mcpServers": [data.get("mcpServers"), *(
                p.get("mcpServers") for p in (projects.values() if isinstance(projects, dict)
                                              else ()) if isinstance(p, dict))]}
        for s in _strings(data, False):
            seen += 1
            if seen > MAX_STRINGS:
                return list(out)
            for word in _WORD.findall(s):
                path = _expand(word, home, workdir)
                if path is None or not any(_inside(path, f) and path != f for f in folders):
                    continue
                out.setdefault(path, None)
                if len(out) >= MAX_NAMED:
                    return list(out)
    return list(out)
