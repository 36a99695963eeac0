"""Policy rules: `[[rules]]` tables whose CEL condition (`when`) names a
decision (allow, deny or ask) and a reason.

Layers: machine config, then user config, then blueprint. Tighten-only: only
machine rules may allow; a user's or a blueprint's allow rule is dropped at
merge with a warning. Among the rules that match one call the strictest
decision wins (deny > ask > allow), the first such rule naming it. A rule
that fails at run time (a missing key, a type error, its step budget) counts
as a match with decision deny, the error in the reason: fails closed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from leviathd.hosts import address_facts
from leviathd.policy.cel import MAX_STEPS, CelError, Program, compile_expr

RuleDecision = Literal["allow", "deny", "ask"]
VARIABLES = ("call", "agent", "taint", "ledger", "time")
MAX_RULES = 256  # per layer
MAX_REASON = 200
RANK = {"allow": 0, "ask": 1, "deny": 2}
# Steps one call may spend on all its rules, every layer and every file of
# it together (each rule also keeps its own cel.MAX_STEPS): what bounds the
# worst call's time, whoever wrote the rules (docs/configuration.md).
MAX_CALL_STEPS = 40_000
# What running one rule costs besides its nodes, charged to the call's
# budget: thousands of trivial rules times many files cost time too.
RULE_OVERHEAD = 16
# The ledger a rule sees: its newest entries, enough to tell what the agent
# has been reading, bounded so a long-lived agent's rules cost the same.
LEDGER_TAIL = 32


@dataclass(frozen=True)
class RuleSpec:
    name: str
    when: str
    decision: RuleDecision
    reason: str = ""
    layer: str = "machine"  # machine | user | blueprint


@dataclass(frozen=True)
class CompiledRule:
    spec: RuleSpec
    program: Program | None  # None: failed to compile (a stale snapshot): always deny
    error: str = ""

    @property
    def label(self) -> str:
        return f"rule:{self.spec.layer}:{self.spec.name}"

    @property
    def reads_address(self) -> bool:
        """Whether it reads `call.address` or `call.ip` (a call not resolved
        yet is judged by such a rule only once it is: broker/core.py)."""
        return self.program is not None and reads_call_field(self.program, ADDRESS_FIELDS)


@dataclass(frozen=True)
class RuleResult:
    decision: RuleDecision
    rule: str  # rule:LAYER:NAME
    reason: str
    error: str = ""


def compile_rule(when: str) -> Program:
    """Raises CelError (with a column) for a bad rule."""
    return compile_expr(when, VARIABLES)


def compile_rules(specs: Iterable[RuleSpec]) -> tuple[CompiledRule, ...]:
    out: list[CompiledRule] = []
    for spec in specs:
        try:
            out.append(CompiledRule(spec, compile_rule(spec.when)))
        except CelError as exc:
            out.append(CompiledRule(spec, None, str(exc)))
    return tuple(out)


def tool_guard(program: Program) -> frozenset[str] | None:
    """The tools a rule can match, when its condition is an `&&` chain with a
    conjunct `call.tool == "x"` or `call.tool in ["x", "y"]`; None: any tool.
    Skipping such a rule for another tool is exact, not a shortcut: CEL's
    `false && <error>` is false, so the rule could neither match nor fail."""
    stack = [program.tree]
    while stack:
        node = stack.pop()
        if node[0] == "&&":
            stack += [node[2], node[3]]
            continue
        if node[0] in ("==", "in") and _is_call_tool(node[2]):
            other = node[3]
            if node[0] == "==" and other[0] == "lit" and isinstance(other[2], str):
                return frozenset((other[2],))
            if node[0] == "in" and other[0] == "list" and all(
                    c[0] == "lit" and isinstance(c[2], str) for c in other[2:]):
                return frozenset(c[2] for c in other[2:])
    return None


ADDRESS_FIELDS = frozenset({"address", "ip"})


def reads_call_field(program: Program, names: frozenset[str]) -> bool:
    """Whether the condition reads one of `call`'s fields `names` (as
    `call.x` or `call["x"]`)."""
    stack = [program.tree]
    while stack:
        node = stack.pop()
        base = node[2] if node[0] in ("field", "index") else None
        if base is not None and base[0] == "var" and base[2] == "call":
            key = node[3]
            if node[0] == "field" and key in names:
                return True
            if node[0] == "index" and (key[0] != "lit" or key[2] in names):
                return True  # a computed key may be any field
        stack.extend(c for c in node[2:] if isinstance(c, tuple))
    return False


def _is_call_tool(node: tuple[Any, ...]) -> bool:
    return bool(node[0] == "field" and node[3] == "tool" and node[2][0] == "var"
                and node[2][2] == "call")


class RuleSet:
    """Compiled rules indexed by the tools they can match, so a call pays only
    for the rules that concern its tool (and those that name none)."""

    def __init__(self, rules: Sequence[CompiledRule]) -> None:
        self.rules = tuple(rules)
        self._any: list[int] = []
        self._by_tool: dict[str, list[int]] = {}
        for i, rule in enumerate(self.rules):
            tools = tool_guard(rule.program) if rule.program is not None else None
            if tools is None:
                self._any.append(i)
            else:
                for tool in tools:
                    self._by_tool.setdefault(tool, []).append(i)
        self._cache: dict[str, tuple[CompiledRule, ...]] = {}

    def __len__(self) -> int:
        return len(self.rules)

    def for_tool(self, tool: str) -> tuple[CompiledRule, ...]:
        found = self._cache.get(tool)
        if found is None:
            # Layer order kept: the first of equally strict rules is named.
            idx = sorted({*self._any, *self._by_tool.get(tool, ())})
            found = tuple(self.rules[i] for i in idx)
            if len(self._cache) < 64:  # tools are a closed set; stay bounded anyway
                self._cache[tool] = found
        return found


class StepBudget:
    """The steps left for one call's rules (MAX_CALL_STEPS)."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


def evaluate(rules: Sequence[CompiledRule], env: Mapping[str, Any],
             budget: StepBudget | None = None) -> RuleResult | None:
    """The strictest matching rule's result, or None when none matched. With
    `budget`, each rule runs with what the call has left (at most its own
    MAX_STEPS); once the call's budget is spent, the next rule counts as a
    deny that names it, like a rule over its own budget: fails closed."""
    best: RuleResult | None = None
    for rule in rules:
        if best is not None and best.decision == "deny":
            break  # nothing is stricter than a deny
        if budget is not None:
            budget.left -= RULE_OVERHEAD
        steps = MAX_STEPS if budget is None else min(MAX_STEPS, budget.left)
        if budget is not None and steps <= 0:
            why = f"the call's rules ran over their step budget ({MAX_CALL_STEPS} steps)"
            return RuleResult("deny", rule.label, f"rule not run: {why}", why)
        if rule.program is None:
            result = RuleResult("deny", rule.label, f"rule does not compile: {rule.error}",
                                rule.error)
        else:
            try:
                matched = rule.program.evaluate(env, max_steps=steps, spent=budget)
            except CelError as exc:
                result = RuleResult("deny", rule.label, f"rule failed: {exc}", str(exc))
            except Exception as exc:  # a bug here must still fail closed, named
                why = f"internal error: {type(exc).__name__}"
                result = RuleResult("deny", rule.label, f"rule failed: {why}", why)
            else:
                if matched is not True:
                    if matched is not False:
                        why = f"rule yielded {type(matched).__name__}, not bool"
                        result = RuleResult("deny", rule.label, f"rule failed: {why}", why)
                    else:
                        continue
                else:
                    result = RuleResult(rule.spec.decision, rule.label,
                                        rule.spec.reason or rule.spec.when)
        if best is None or RANK[result.decision] > RANK[best.decision]:
            best = result
    return best


def environment(
    *, tool: str, target: str, args: Mapping[str, Any], paths: Sequence[str], taint: str,
    agent: Mapping[str, Any], ledger: Iterable[tuple[str, str, str]], now: float | None = None,
    kind: str = "", requested: str = "", host: str = "", address: str = "",
) -> dict[str, Any]:
    """What a rule sees. `ledger`: (tool, target, label) of the live entries,
    oldest first. `kind`: what the call does (rule_kind); `requested`: the
    path(s) or URL as the agent wrote them, where `target`/`paths` are what
    will really be touched (the opened files' real paths, the canonical
    host); `address`: the IP address the call will dial ("" for none)."""
    entries = list(ledger)
    tail = entries[-LEDGER_TAIL:]
    unix = time.time() if now is None else now
    t = time.localtime(unix)
    return {
        "call": {"tool": tool, "target": target, "args": _plain(args, 4), "paths": tuple(paths),
                 "kind": kind, "requested": requested, "host": host, "address": address,
                 "ip": address_facts(address)},
        "agent": agent,
        "taint": taint,
        "ledger": {
            "size": len(entries),
            "tools": tuple(dict.fromkeys(e[0] for e in tail)),
            "targets": tuple(e[1] for e in tail),
            "labels": tuple(dict.fromkeys(e[2] for e in tail)),
        },
        "time": {"unix": int(unix), "hour": t.tm_hour, "minute": t.tm_min,
                 "weekday": t.tm_wday},
    }


def _plain(value: Any, depth: int) -> Any:
    """The call's arguments as CEL values (the schema has bounded them)."""
    if isinstance(value, (str, bool, int)) or value is None:
        return value
    if depth <= 0:
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain(v, depth - 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v, depth - 1) for v in value)
    return str(value)
