"""One user's policy rules never hold up anyone else's calls.

Rules are CPU work on the daemon's event loop, which serves every user's bus
calls and every agent's broker. Two bounds keep one user's rules from
slowing the others (issue 31: 512 rules of one user's made bob's `lev ps`
take seconds):

- a call's rules have one step budget together (rules.MAX_CALL_STEPS), so
  the worst call costs about a millisecond whatever the rule set;
- a call's rules run here in slices of about SLICE_STEPS steps, the loop
  getting a turn between slices, and one user's calls take turns in a lane
  of their own (one evaluation at a time per user, first come first
  served): however many agents and calls a user floods with, another
  user's request waits at most about one slice per busy user.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from leviathd.policy.rules import (
    MAX_CALL_STEPS,
    RANK,
    CompiledRule,
    RuleResult,
    StepBudget,
    evaluate,
)

SLICE_STEPS = 2_000


class Lanes:
    """A lane (an asyncio.Lock) per uid, for the brokers of one daemon; a
    lane nobody holds or waits for is dropped, so this stays as small as
    the set of users whose agents are calling now."""

    def __init__(self) -> None:
        self._lanes: dict[int, tuple[asyncio.Lock, list[int]]] = {}

    def lane(self, uid: int) -> Lane:
        return Lane(self, uid)

    def _enter(self, uid: int) -> asyncio.Lock:
        lock, users = self._lanes.setdefault(uid, (asyncio.Lock(), [0]))
        users[0] += 1
        return lock

    def _leave(self, uid: int) -> None:
        found = self._lanes.get(uid)
        if found is None:
            return
        found[1][0] -= 1
        if found[1][0] <= 0:
            del self._lanes[uid]

    def __len__(self) -> int:
        return len(self._lanes)


class Lane:
    def __init__(self, lanes: Lanes, uid: int) -> None:
        self._lanes = lanes
        self._uid = uid

    async def evaluate(
        self, concern: Sequence[CompiledRule], views: Sequence[Mapping[str, Any]],
    ) -> RuleResult | None:
        """gate.evaluate_views, taking turns: the same result, the first of
        the strictest rules, the same budget."""
        lock = self._lanes._enter(self._uid)
        try:
            async with lock:
                return await _sliced(concern, views)
        finally:
            self._lanes._leave(self._uid)


async def _sliced(
    concern: Sequence[CompiledRule], views: Sequence[Mapping[str, Any]],
) -> RuleResult | None:
    budget = StepBudget(MAX_CALL_STEPS)
    mark = budget.left
    best: RuleResult | None = None
    for env in views:
        for rule in concern:
            found = evaluate((rule,), env, budget)
            if found is not None and (best is None
                                      or RANK[found.decision] > RANK[best.decision]):
                best = found
            if best is not None and best.decision == "deny":
                return best
            if mark - budget.left >= SLICE_STEPS:
                await asyncio.sleep(0)  # the loop's turn: other users' calls
                mark = budget.left
    return best
