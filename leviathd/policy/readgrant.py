"""Matching a real (symlink-resolved) path against the active read-path
grants, compiled once per agent so that a check costs a few dict lookups.

The pattern language is the foundation's (`leviathd/readpaths.py`):
an exact path grants its subtree (`~/` is the user's home, relative entries
resolve against the workdir), `glob:` (`*` stays in one component, `**`
crosses), `regex:` (anchored, absolute). This module is the gate's fast
index over those forms; `compile_grants` is the one entry point the broker
and `lev policy test` use.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from leviathd.errors import InvalidArgument


def is_within(path: str, root: str) -> bool:
    """`path` is `root` or below it; both absolute and normalised."""
    if root == "/":
        return path.startswith("/")
    return path == root or path.startswith(root + "/")


def _expand(text: str, home: str, workdir: str) -> str:
    if text == "~" or text.startswith("~/"):
        text = home + text[1:]
    if not text.startswith("/"):
        text = os.path.join(workdir, text)
    return os.path.normpath(text)


def _glob_regex(glob: str) -> str:
    out = []
    i = 0
    while i < len(glob):
        ch = glob[i]
        if glob.startswith("**", i):
            # `/**/` also matches a single `/`; a trailing `/**` matches the dir itself.
            if glob.startswith("**/", i):
                out.append("(?:.*/)?")
                i += 3
                continue
            out.append(".*")
            i += 2
            continue
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        else:
            out.append(re.escape(ch))
        i += 1
    pattern = "".join(out)
    if pattern.endswith("/.*"):
        pattern = pattern[:-3] + "(?:/.*)?"
    return pattern


@dataclass(frozen=True)
class _Glob:
    source: str
    regex: re.Pattern[str]


class ReadGrant:
    """Compiled grants. `match` returns the grant text that covers a path."""

    def __init__(self, patterns: Sequence[str], *, home: str, workdir: str) -> None:
        self.patterns = tuple(patterns)
        self._exact: dict[str, str] = {}
        self._globs: dict[str, list[_Glob]] = {}  # literal directory prefix → globs
        self._regexes: list[tuple[re.Pattern[str], str]] = []
        self._regex_any: re.Pattern[str] | None = None
        for source in self.patterns:
            if source.startswith("regex:"):
                body = source[len("regex:") :]
                if body.startswith("~/"):
                    body = re.escape(home) + body[1:]
                if not body.startswith("/"):
                    raise InvalidArgument(f"read path {source!r}: a regex must be absolute")
                try:
                    self._regexes.append((re.compile(body, re.DOTALL), source))
                except re.error as exc:
                    raise InvalidArgument(f"read path {source!r}: {exc}") from None
            elif source.startswith("glob:"):
                body = _expand(source[len("glob:") :], home, workdir)
                first = min((i for i, c in enumerate(body) if c in "*?"), default=len(body))
                literal_dir = body[: body.rfind("/", 0, first)] or "/"
                glob = _Glob(source, re.compile(_glob_regex(body), re.DOTALL))
                self._globs.setdefault(literal_dir, []).append(glob)
            else:
                self._exact.setdefault(_expand(source, home, workdir), source)
        if self._regexes:
            try:
                self._regex_any = re.compile(
                    "|".join(f"(?:{p.pattern})" for p, _ in self._regexes), re.DOTALL
                )
            except re.error:
                self._regex_any = None  # e.g. clashing group names: check one by one

    @property
    def active(self) -> bool:
        return bool(self.patterns)

    def match(self, real_path: str) -> str | None:
        # Walk the ancestors once: exact grants cover their subtree, globs are
        # indexed by the literal directory before their first wildcard.
        probe = real_path
        while True:
            hit = self._exact.get(probe)
            if hit is not None:
                return hit
            for glob in self._globs.get(probe, ()):
                if glob.regex.fullmatch(real_path):
                    return glob.source
            if probe == "/":
                break
            cut = probe.rfind("/")
            probe = probe[:cut] or "/"
        if self._regexes and (self._regex_any is None or self._regex_any.fullmatch(real_path)):
            for regex, source in self._regexes:
                if regex.fullmatch(real_path):
                    return source
        return None


def compile_grants(patterns: Sequence[str], *, home: str, workdir: str) -> ReadGrant:
    return ReadGrant(patterns, home=home, workdir=workdir)
