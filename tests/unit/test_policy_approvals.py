from __future__ import annotations

import asyncio

import pytest

from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import AccessDenied, NotFound
from leviathd.policy.approvals import Answer, ApprovalQueue, PendingRequest

X = Sensitivity.PRIVATE


def queue(timeout: float = 5.0) -> tuple[ApprovalQueue, list[PendingRequest]]:
    seen: list[PendingRequest] = []
    q = ApprovalQueue(agent_id="abcd1234", owner_uid=1000, timeout=timeout,
                      on_request=seen.append)
    return q, seen


async def _ask(q: ApprovalQueue) -> Answer:
    return await q.ask(kind="taint", tool="http_post", target="x.org", taint=X,
                       clearance=Sensitivity.INTERNAL, rule="on_exceed=ask")


def test_the_owner_answers_once_and_the_call_goes_on() -> None:
    async def main() -> Answer:
        q, seen = queue()
        task = asyncio.create_task(_ask(q))
        await asyncio.sleep(0)
        q.answer(seen[0].id, Answer.ONCE, by_uid=1000)
        return await task

    assert asyncio.run(main()) is Answer.ONCE


def test_another_user_cannot_answer_but_an_admin_can() -> None:
    async def main() -> Answer:
        q, seen = queue()
        task = asyncio.create_task(_ask(q))
        await asyncio.sleep(0)
        with pytest.raises(AccessDenied):
            q.answer(seen[0].id, Answer.ONCE, by_uid=1001)
        assert q.pending()  # still held
        # The admin verdict comes with the answer (polkit's answer-any, asked by
        # the daemon's gate/answers.py), not from the uid.
        with pytest.raises(AccessDenied):
            q.answer(seen[0].id, Answer.ONCE, by_uid=0)
        q.answer(seen[0].id, Answer.DENY, by_uid=0, admin=True)
        return await task

    assert asyncio.run(main()) is Answer.DENY


def test_no_answer_before_the_timeout_is_a_deny() -> None:
    async def main() -> tuple[Answer, int]:
        q, _ = queue(timeout=0.05)
        answer = await _ask(q)
        return answer, len(q.pending())

    assert asyncio.run(main()) == (Answer.DENY, 0)


def test_a_session_answer_is_remembered_for_the_agent() -> None:
    async def main() -> ApprovalQueue:
        q, seen = queue()
        task = asyncio.create_task(_ask(q))
        await asyncio.sleep(0)
        q.answer(seen[0].id, Answer.SESSION, by_uid=1000)
        await task
        return q

    q = asyncio.run(main())
    assert q.session.taint_approved("http_post", "x.org", X)
    assert not q.session.taint_approved("http_post", "y.org", X)


def test_answering_an_unknown_request_is_not_found() -> None:
    q, _ = queue()
    with pytest.raises(NotFound):
        q.answer("nope", Answer.ONCE, by_uid=1000)
