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

from leviathd.policy.cel import CelError, Program, compile_expr

RuleDecision = Literal["allow", "deny", "ask"]
VARIABLES = ("call", "agent", "taint", "ledger", "time")
MAX_RULES = 256  # per layer
MAX_REASON = 200
_RANK = {"allow": 0, "ask": 1, "deny": 2}
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


def evaluate(rules: Sequence[CompiledRule], env: Mapping[str, Any]) -> RuleResult | None:
    """The strictest matching rule's result, or None when none matched."""
    best: RuleResult | None = None
    for rule in rules:
        if best is not None and best.decision == "deny":
            break  # nothing is stricter than a deny
        if rule.program is None:
            result = RuleResult("deny", rule.label, f"rule does not compile: {rule.error}",
                                rule.error)
        else:
            try:
                matched = rule.program.evaluate(env)
            except CelError as exc:
                result = RuleResult("deny", rule.label, f"rule failed: {exc}", str(exc))
            except RecursionError:  # pragma: no cover - depth is bounded at compile
                result = RuleResult("deny", rule.label, "rule failed: too deep", "too deep")
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
        if best is None or _RANK[result.decision] > _RANK[best.decision]:
            best = result
    return best


def environment(
    *, tool: str, target: str, args: Mapping[str, Any], paths: Sequence[str], taint: str,
    agent: Mapping[str, Any], ledger: Iterable[tuple[str, str, str]], now: float | None = None,
) -> dict[str, Any]:
    """What a rule sees. `ledger`: (tool, target, label) of the live entries,
    oldest first."""
    entries = list(ledger)
    tail = entries[-LEDGER_TAIL:]
    t = time.localtime(time.time() if now is None else now)
    return {
        "call": {"tool": tool, "target": target, "args": _plain(args, 4), "paths": tuple(paths)},
        "agent": agent,
        "taint": taint,
        "ledger": {
            "size": len(entries),
            "tools": tuple(dict.fromkeys(e[0] for e in tail)),
            "targets": tuple(e[1] for e in tail),
            "labels": tuple(dict.fromkeys(e[2] for e in tail)),
        },
        "time": {"unix": int(time.mktime(t)), "hour": t.tm_hour, "minute": t.tm_min,
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
