"""Who may see and answer a held call (leviathd/gate/answers.py): its owner,
without polkit being asked; anyone else only with answer-any, and to them
without it the request does not exist. The admin verdict reaches the queue
as an argument of that one answer (no state left behind for another call)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from leviathd.authority import Call, Caller, Limited, Right
from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import NotFound
from leviathd.gate.answers import Answers
from leviathd.policy.approvals import Answer, PendingRequest

ALICE = Caller(sender=":1.1", uid=1000, pid=1)
BOB = Caller(sender=":1.2", uid=1001, pid=2)
REQ = PendingRequest(id="r1", agent_id="a1", owner_uid=1000, kind="taint", tool="http_post",
                     target="x.org", taint=Sensitivity.PRIVATE, clearance=None, rule="",
                     created=0.0)


class _Polkit:
    def __init__(self, yes: set[int]) -> None:
        self.yes = yes
        self.asked: list[tuple[int, Right]] = []

    async def allowed(self, who: Caller, right: Right) -> bool:
        self.asked.append((who.uid, right))
        return who.uid in self.yes

    async def require(self, who: Caller, right: Right, what: str) -> None:
        raise AssertionError("not used")


class _Gate:
    def __init__(self) -> None:
        self.answered: list[tuple[str, Answer, int, bool]] = []

    def find(self, request_id: str) -> PendingRequest | None:
        return REQ if request_id == REQ.id else None

    def pending(self, uid: int | None) -> list[PendingRequest]:
        return [REQ] if uid in (None, REQ.owner_uid) else []

    def answer(self, request_id: str, answer: Answer, by_uid: int, *, admin: bool) -> None:
        self.answered.append((request_id, answer, by_uid, admin))


def _call(who: Caller, polkit: _Polkit) -> Call:
    return Call(who, Limited(polkit, who, {Right.ANSWER_ANY}))


def _answers() -> tuple[Answers, _Gate]:
    gate = _Gate()
    gate_any: Any = gate
    return Answers(gate_any), gate


def test_the_owner_answers_without_polkit_being_asked() -> None:
    answers, gate = _answers()
    polkit = _Polkit(yes=set())
    asyncio.run(answers.answer(_call(ALICE, polkit), "r1", "once"))
    assert gate.answered == [("r1", Answer.ONCE, 1000, False)]
    assert polkit.asked == []


def test_another_user_without_answer_any_finds_no_such_request() -> None:
    answers, gate = _answers()
    polkit = _Polkit(yes=set())
    with pytest.raises(NotFound) as other:
        asyncio.run(answers.answer(_call(BOB, polkit), "r1", "once"))
    with pytest.raises(NotFound) as never:
        asyncio.run(answers.answer(_call(BOB, polkit), "nope", "once"))
    assert str(other.value).replace("r1", "X") == str(never.value).replace("nope", "X")
    assert gate.answered == []
    assert asyncio.run(answers.pending(_call(BOB, polkit))) == []


def test_an_admin_answers_and_the_verdict_goes_with_the_answer() -> None:
    answers, gate = _answers()
    polkit = _Polkit(yes={1001})
    asyncio.run(answers.answer(_call(BOB, polkit), "r1", "deny"))
    assert gate.answered == [("r1", Answer.DENY, 1001, True)]
    assert polkit.asked == [(1001, Right.ANSWER_ANY)]
    assert asyncio.run(answers.pending(_call(BOB, polkit))) == [REQ]
