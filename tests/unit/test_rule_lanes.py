"""Issue 31 §4: one user's rules are bounded per call and take turns.

- A call's rules share one step budget (MAX_CALL_STEPS) across all layers
  and files: 768 rules (256 per layer) each just under its own budget used
  to run whole, about 15 million steps, half a second on the loop; now the
  call stops at the budget with a deny naming the next rule (seen failing:
  the old evaluation ran them all and matched nothing).
- Evaluation in the broker yields to the loop between slices, so another
  user's work runs while one user's rules are evaluated; one user's calls
  take turns in her lane (never two of hers interleaved); the lane result
  is the gate's own."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from leviathd.broker.rulelane import SLICE_STEPS, Lanes
from leviathd.policy.decision import evaluate_views
from leviathd.policy.rules import (
    MAX_CALL_STEPS,
    MAX_RULES,
    CompiledRule,
    RuleSpec,
    StepBudget,
    compile_rules,
    environment,
    evaluate,
)


def _tree(n: int) -> str:
    if n == 1:
        return 'call.target.contains("zzq")'
    return "(" + _tree(n // 2) + " || " + _tree(n - n // 2) + ")"


# Each rule: 100 string tests over a 12,000-character target, about 19,000
# steps: under its own budget (20,000), matching nothing.
HEAVY = _tree(100)


def _env(target_len: int = 12_000) -> dict[str, object]:
    return environment(tool="read_file", target="/w/" + "a" * target_len, args={},
                       paths=("/w/x",), taint="public", agent={}, ledger=())


MEDIUM = _tree(8)  # about 1,500 steps each


def _rules(n: int, when: str = HEAVY, decision: str = "deny") -> tuple[CompiledRule, ...]:
    """n rules of the same condition, named apart, in the three layers
    (compiled once: the test is about evaluation)."""
    (one,) = compile_rules([RuleSpec("r", when, decision)])  # type: ignore[arg-type]
    layers = ("machine", "user", "blueprint")
    return tuple(replace(one, spec=replace(one.spec, name=f"r{i}", layer=layers[i % 3]))
                 for i in range(n))


def test_one_heavy_rule_is_under_its_own_budget() -> None:
    rules = _rules(1)
    budget = StepBudget(MAX_CALL_STEPS)
    assert evaluate(rules, _env(), budget) is None
    assert MAX_CALL_STEPS // 3 < MAX_CALL_STEPS - budget.left < MAX_CALL_STEPS


def test_a_calls_rules_stop_at_the_calls_budget_and_deny() -> None:
    rules = _rules(3 * MAX_RULES)
    budget = StepBudget(MAX_CALL_STEPS)
    result = evaluate(rules, _env(), budget)
    assert result is not None and result.decision == "deny"
    assert "step budget" in result.reason
    # Nothing ran past the call's budget but the one rule that met it.
    assert budget.left > -20_000


def test_many_trivial_rules_over_many_files_are_bounded_too() -> None:
    rules = _rules(3 * MAX_RULES, when="call.target == \"nothing\"")
    views = [_env(10) for _ in range(64)]
    result = evaluate_views(rules, views)
    assert result is not None and "step budget" in result.reason


def test_the_lane_gives_the_gates_result() -> None:
    rules = _rules(5, when='call.target.endsWith("a")', decision="ask")
    views = [_env(100)]
    assert asyncio.run(Lanes().lane(1).evaluate(rules, views)) == evaluate_views(rules, views)
    none = _rules(5, when='call.target == "x"')
    assert asyncio.run(Lanes().lane(1).evaluate(none, views)) is None


def test_the_loop_gets_turns_while_one_users_rules_run_and_her_calls_take_turns() -> None:
    rules = _rules(3 * MAX_RULES, MEDIUM)
    views = [_env()]
    turns: list[str] = []

    async def main() -> None:
        lanes = Lanes()
        alice = lanes.lane(1000)
        done = asyncio.Event()

        async def bob() -> None:
            while not done.is_set():
                turns.append("bob")
                await asyncio.sleep(0)

        async def call(name: str) -> None:
            turns.append(f"{name}-start")
            result = await alice.evaluate(rules, views)
            assert result is not None and result.decision == "deny"
            turns.append(f"{name}-end")

        watcher = asyncio.create_task(bob())
        await asyncio.gather(call("a1"), call("a2"))
        done.set()
        await watcher
        assert len(lanes) == 0  # the lane went with its last user

    asyncio.run(main())
    a1_end = turns.index("a1-end")
    # bob ran between the start and the end of alice's first evaluation,
    # several times: it was sliced (a budget of this size is several slices).
    assert turns[:a1_end].count("bob") >= MAX_CALL_STEPS // SLICE_STEPS // 2, turns
    assert turns.count("a1-start") == 1
    # Her second call was evaluated after the first, in slices of its own
    # (interleaved, the two would have ended about together).
    a2_end = turns.index("a2-end")
    assert turns[a1_end:a2_end].count("bob") >= MAX_CALL_STEPS // SLICE_STEPS // 2, turns
