"""A fast index over the foundation's read grants (`leviathd.readpatterns`).

`readpatterns.may_read` tries every active pattern in turn; with a thousand
patterns that is too slow for a check on every tool call. This index gives
the same answers (a test compares the two on generated paths) with a few
dict lookups: exact grants by their base path, and every regex pattern
(`glob:` and `regex:`) filed under the literal directory its matches must
start with, so a path only meets the patterns filed under one of its
ancestors. Patterns with no usable literal prefix are tried one by one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from leviathd.readpatterns import CompiledPattern, ReadGrants, compile_grants, is_inside

_SPECIAL = set(".^$*+?{}[]|()")
_QUANTIFIERS = set("*+?{")


def literal_prefix(regex: str) -> str:
    """Characters every match of `regex` must start with ("" when unknown).
    Conservative: any `|` gives up, and a literal followed by a quantifier is
    not part of the prefix."""
    return _literal_split(regex)[0]


# What may follow a literal that ends exactly at a path component boundary
# (the read-path engine writes `**` as this group).
_ANY_COMPONENTS = "(?:/[^/]+)*"


def index_key(regex: str) -> str | None:
    """The deepest directory every match of `regex` lies in or is: the
    literal prefix itself when it is followed by `/`, the end, or a `**`
    group; else the literal up to its last `/`. None when unknown."""
    prefix, rest = _literal_split(regex)
    if not prefix.startswith("/"):
        return None
    tail = rest[len(_ANY_COMPONENTS):] if rest.startswith(_ANY_COMPONENTS) else rest
    if len(prefix) > 1 and (tail == "" or tail.startswith("/")) and not prefix.endswith("/"):
        return prefix
    return prefix[: prefix.rfind("/")] or "/"


def _literal_split(regex: str) -> tuple[str, str]:
    if "|" in regex:
        return "", regex
    out: list[str] = []
    i = 0
    while i < len(regex):
        ch = regex[i]
        if ch == "\\":
            if i + 1 >= len(regex) or regex[i + 1].isalnum():
                break  # \d, \w, \A ... are not literals
            lit, step = regex[i + 1], 2
        elif ch in _SPECIAL:
            break
        else:
            lit, step = ch, 1
        if i + step < len(regex) and regex[i + step] in _QUANTIFIERS:
            break
        out.append(lit)
        i += step
    return "".join(out), regex[i:]


def _real_form(path: str) -> bool:
    return path.startswith("/") and not path.startswith("//") and os.path.normpath(path) == path


class GrantIndex:
    def __init__(self, grants: ReadGrants) -> None:
        self.grants = grants
        self._exact: dict[str, str] = {}
        self._by_dir: dict[str, list[CompiledPattern]] = {}
        self._loose: list[CompiledPattern] = []
        for compiled in grants.patterns:
            if compiled.base is not None:
                self._exact.setdefault(compiled.base, compiled.pattern.text)
                continue
            key = index_key(compiled.regex.pattern)
            if key is None:
                self._loose.append(compiled)
                continue
            self._by_dir.setdefault(key, []).append(compiled)

    @property
    def active(self) -> bool:
        return bool(self.grants.patterns)

    @property
    def workdir(self) -> str:
        return self.grants.workdir

    def hidden(self, real: str) -> bool:
        return any(is_inside(real, h) for h in self.grants.hidden)

    def match(self, real: str) -> str | None:
        """The active pattern that grants `real` (ignoring workdir and hidden
        paths), or None."""
        probe = real
        while True:
            hit = self._exact.get(probe)
            if hit is not None:
                return hit
            for compiled in self._by_dir.get(probe, ()):
                if compiled.regex.fullmatch(real):
                    return compiled.pattern.text
            if probe == "/":
                break
            probe = probe[: probe.rfind("/")] or "/"
        for compiled in self._loose:
            if compiled.regex.fullmatch(real):
                return compiled.pattern.text
        return None

    def may_read(self, real: str) -> bool:
        """Same answer as `readpatterns.may_read(real, grants)`."""
        if not _real_form(real) or self.hidden(real):
            return False
        return is_inside(real, self.grants.workdir) or self.match(real) is not None

    def may_write(self, real: str) -> bool:
        if not _real_form(real) or self.hidden(real):
            return False
        return is_inside(real, self.grants.workdir)


def build_index(
    active: Iterable[str], *, home: str, workdir: str, hidden: Iterable[str] = ()
) -> GrantIndex:
    return GrantIndex(compile_grants(active, home=home, workdir=workdir, hidden=hidden))
