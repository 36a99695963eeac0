"""Who may see and answer the calls the gate holds for a person: the agent's
owner, or anyone polkit grants `org.leviath.approval.answer-any`. To anyone
else another user's request does not exist (NotFound, as for an id never
issued). The admin verdict is asked through the call's Authority, only when
the caller is not the owner, and handed to the gate with the answer."""

from __future__ import annotations

from leviathd.authority import Call, Right
from leviathd.errors import NotFound
from leviathd.gate.service import GateService
from leviathd.policy.approvals import Answer, PendingRequest


class Answers:
    def __init__(self, gate: GateService) -> None:
        self._gate = gate

    async def pending(self, call: Call) -> list[PendingRequest]:
        """The caller's agents' pending requests (everyone's for an admin)."""
        everyone = await call.authority.allowed(call.who, Right.ANSWER_ANY)
        return self._gate.pending(None if everyone else call.who.uid)

    async def answer(self, call: Call, request_id: str, answer: str) -> None:
        parsed = Answer.parse(answer)
        req = self._gate.find(request_id)
        if req is None:
            raise NotFound(f"no pending approval {request_id!r}")
        admin = False
        if req.owner_uid != call.who.uid:
            admin = await call.authority.allowed(call.who, Right.ANSWER_ANY)
            if not admin:
                raise NotFound(f"no pending approval {request_id!r}")
        self._gate.answer(request_id, parsed, call.who.uid, admin=admin)
