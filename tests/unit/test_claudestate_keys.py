"""Every key the installed Claude Code knows in ~/.claude.json is classified
by sandbox/claudestate.py: comes back (session state) or is left out on
purpose (threats.md, "re-implementing a tool"). A new release that adds a
key fails here until someone decides which it is; an unclassified key is
left out meanwhile (the allow-list's default), never let through.

The keys are read from the real package scripts/setup installs (pinned):
its defaults for the global config and for a project's entry, two object
literals in the program."""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Iterator

import pytest

from leviathd.sandbox import claudestate

CLAUDE = ("/opt/leviath-dev/npm/prefix/lib/node_modules/@anthropic-ai/claude-code/"
          "bin/claude.exe")
# The start of each object literal in the program (its first keys).
GLOBAL = b"numStartups:0,installMethod:"
PROJECT = b"allowedTools:[],mcpContextUris:[]"
_KEY = re.compile(rb"[A-Za-z_$][\w$]*:")


def _keys(data: mmap.mmap, marker: bytes) -> list[str]:
    """The keys at the top level of the object literal starting at `marker`."""
    i = j = data.find(marker)
    assert i >= 0, f"{marker!r} not found in {CLAUDE}: read the new release's defaults"
    depth, out = 0, []
    while depth >= 0 and j < i + 100_000:
        c = data[j:j + 1]
        if c in b"{[(":
            depth += 1
        elif c in b"}])":
            depth -= 1
        elif c in b"\"'`":
            j += 1
            while data[j:j + 1] != c:
                j += 2 if data[j:j + 1] == b"\\" else 1
        elif depth == 0 and (j == i or data[j - 1:j] == b","):
            m = _KEY.match(data, j)
            if m:
                out.append(m.group()[:-1].decode())
                j = m.end()
                continue
        j += 1
    return out


@pytest.fixture(scope="module")
def program() -> Iterator[mmap.mmap]:
    if not os.path.exists(CLAUDE):
        pytest.fail(f"{CLAUDE} is missing: run scripts/setup (it fetches the pinned npm packages)")
    with open(CLAUDE, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        yield m


def test_every_global_key_is_classified(program: mmap.mmap) -> None:
    keys = _keys(program, GLOBAL)
    assert len(keys) > 20, keys
    unknown = [k for k in keys if not claudestate._top_allowed(k) and k not in claudestate.LEFT_OUT]
    assert unknown == [], f"classify in claudestate.py (TOP_KEYS or LEFT_OUT): {unknown}"
    both = [k for k in claudestate.LEFT_OUT if claudestate._top_allowed(k)]
    assert both == [], both


def test_every_project_key_is_classified(program: mmap.mmap) -> None:
    keys = _keys(program, PROJECT)
    assert "hasTrustDialogAccepted" in keys, keys
    unknown = [k for k in keys
               if not claudestate._project_allowed(k) and k not in claudestate.PROJECT_LEFT_OUT]
    assert unknown == [], f"classify in claudestate.py (PROJECT_KEYS, PROJECT_LEFT_OUT): {unknown}"
    both = [k for k in claudestate.PROJECT_LEFT_OUT if claudestate._project_allowed(k)]
    assert both == [], both
