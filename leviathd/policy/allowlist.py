"""`[[allowlist]]` rules: a tool may send data up to `max_sensitivity` to
targets matching a glob, above its clearance.

Matching must stay fast with thousands of rules, so rules are indexed when
compiled: exact targets in a dict, `*suffix` and `prefix*` globs by their
literal part, and only the remaining globs go through one combined regex.
Globs: `*` matches any run of characters (dots and slashes included), `?`
one character; everything else is literal; hosts compare case-insensitively.
`shell` rules are the exception: they match a parsed command line
(policy/shellrule.py). A rule for tool `*` is no rule: it matches nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from leviathd.domain.allowrule import AllowRule
from leviathd.domain.sensitivity import Sensitivity
from leviathd.domain.tools import TOOLS
from leviathd.errors import InvalidArgument
from leviathd.policy.shellrule import ShellPattern


@dataclass(frozen=True)
class IndexedRule:
    """An `AllowRule` as compiled: its tool name resolved, its place in the
    merged config kept for messages."""

    tool: str
    target: str
    max_sensitivity: Sensitivity
    index: int = 0  # position in the merged config, for messages

    def describe(self) -> str:
        return (
            f"allowlist #{self.index}: {self.tool} → {self.target!r} "
            f"up to {self.max_sensitivity}"
        )


def glob_to_regex(glob: str) -> str:
    out = []
    for ch in glob:
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        else:
            out.append(re.escape(ch))
    return "".join(out)


@dataclass
class _ToolIndex:
    exact: dict[str, list[IndexedRule]] = field(default_factory=dict)
    suffix: dict[str, list[IndexedRule]] = field(default_factory=dict)  # "*literal"
    prefix: dict[str, list[IndexedRule]] = field(default_factory=dict)  # "literal*"
    suffix_lengths: tuple[int, ...] = ()
    prefix_lengths: tuple[int, ...] = ()
    other: list[tuple[re.Pattern[str], IndexedRule]] = field(default_factory=list)
    other_any: re.Pattern[str] | None = None  # prefilter, no groups (faster on a miss)
    other_which: re.Pattern[str] | None = None

    def finish(self) -> None:
        self.suffix_lengths = tuple(sorted({len(k) for k in self.suffix}))
        self.prefix_lengths = tuple(sorted({len(k) for k in self.prefix}))
        if self.other:
            # One capturing group per rule (the translated globs have none of
            # their own), so `lastindex` names the first rule that matched.
            flags = re.IGNORECASE | re.DOTALL
            self.other_any = re.compile("|".join(f"(?:{p.pattern})" for p, _ in self.other), flags)
            self.other_which = re.compile("|".join(f"({p.pattern})" for p, _ in self.other), flags)

    def candidates(self, target: str, taint: Sensitivity) -> Iterable[IndexedRule]:
        yield from self.exact.get(target, ())
        n = len(target)
        for length in self.suffix_lengths:
            if length > n:
                break
            yield from self.suffix.get(target[n - length :], ())
        for length in self.prefix_lengths:
            if length > n:
                break
            yield from self.prefix.get(target[:length], ())
        if self.other_any is not None and self.other_any.fullmatch(target):
            assert self.other_which is not None
            m = self.other_which.fullmatch(target)
            first = m.lastindex if m is not None and m.lastindex is not None else 1
            rule = self.other[first - 1][1]
            if rule.max_sensitivity >= taint:
                yield rule
            else:
                # Only a later rule with a higher max_sensitivity can still cover it.
                for pattern, later in self.other[first:]:
                    if later.max_sensitivity >= taint and pattern.fullmatch(target):
                        yield later
                        break


class Allowlist:
    def __init__(self, rules: Sequence[IndexedRule]) -> None:
        self.rules = tuple(rules)
        self._by_tool: dict[str, _ToolIndex] = {}
        # shell rules match the parsed command line (policy/shellrule.py).
        self._shell: list[tuple[ShellPattern, IndexedRule]] = []
        for rule in self.rules:
            if rule.tool == "shell":
                try:
                    self._shell.append((ShellPattern(rule.target), rule))
                except ValueError:
                    pass  # matches nothing; the config check reports it
                continue
            if rule.tool == "*":
                # Not a tool: such a rule matches nothing (config check says so).
                continue
            index = self._by_tool.setdefault(rule.tool, _ToolIndex())
            glob = rule.target.lower()
            stars = glob.count("*")
            if "?" not in glob and stars == 0:
                index.exact.setdefault(glob, []).append(rule)
            elif "?" not in glob and stars == 1 and glob.startswith("*"):
                index.suffix.setdefault(glob[1:], []).append(rule)
            elif "?" not in glob and stars == 1 and glob.endswith("*"):
                index.prefix.setdefault(glob[:-1], []).append(rule)
            else:
                pattern = re.compile(glob_to_regex(glob), re.IGNORECASE | re.DOTALL)
                index.other.append((pattern, rule))
        for index in self._by_tool.values():
            index.finish()

    def find(self, tool: str, target: str, taint: Sensitivity) -> IndexedRule | None:
        """The first rule (in config order) for `tool` whose glob matches
        `target` and whose max_sensitivity covers `taint`."""
        if tool == "shell":
            for pattern, rule in self._shell:
                if rule.max_sensitivity >= taint and pattern.matches(target):
                    return rule
            return None
        best: IndexedRule | None = None
        index = self._by_tool.get(tool)
        if index is None:
            return None
        for rule in index.candidates(target.lower(), taint):
            if rule.max_sensitivity >= taint and (best is None or rule.index < best.index):
                best = rule
        return best


def compile_allowlist(raw: Iterable[AllowRule | Mapping[str, object]]) -> Allowlist:
    """From the config's rules (or their snapshot form: dicts with the same keys)."""
    rules = []
    for i, item in enumerate(raw, start=1):
        if not isinstance(item, AllowRule):
            try:
                item = AllowRule.model_validate(item)
            except ValidationError:
                raise InvalidArgument(
                    f"allowlist entry {i} needs tool, target and max_sensitivity"
                ) from None
        rules.append(IndexedRule(TOOLS.canonical(item.tool), item.target, item.max_sensitivity, i))
    return Allowlist(rules)
