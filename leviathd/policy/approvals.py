"""Calls held for a person's answer. One queue per agent; ids are random so
they are unique across agents and cannot be guessed from one another.

Only the agent's owner, or an admin (the daemon asks polkit for
`org.leviath.approval.answer-any` and says so with the answer: `admin`),
may answer. With no answer before the timeout, the call is denied.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from leviathd import metrics
from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import AccessDenied, InvalidArgument, LimitExceeded, NotFound
from leviathd.policy.decision import ApprovalView, AskKind


class Answer(Enum):
    ONCE = "once"
    SESSION = "session"
    DENY = "deny"

    @classmethod
    def parse(cls, text: str) -> Answer:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise InvalidArgument(f"answer must be once, session or deny, not {text!r}") from None


@dataclass(frozen=True)
class PendingRequest:
    id: str
    agent_id: str
    owner_uid: int
    kind: AskKind
    tool: str
    target: str
    taint: Sensitivity
    clearance: Sensitivity | None
    rule: str
    created: float
    # What exactly the call would do (web: method, full URL, port, body size,
    # the headers the agent set), for the person deciding.
    detail: str = ""
    # What a --session answer covers (web: host:port).
    scope: str = ""


@dataclass
class _Held:
    request: PendingRequest
    future: asyncio.Future[Answer]
    answered_by: int | None = None


@dataclass
class SessionApprovals:
    """`--session` answers, remembered for the agent's life. A taint approval
    covers the same tool and target up to the taint it was given at."""

    tools: set[str] = field(default_factory=set)
    targets: dict[tuple[str, str], Sensitivity] = field(default_factory=dict)

    def permission_approved(self, tool: str) -> bool:
        return tool in self.tools

    def taint_approved(self, tool: str, target: str, taint: Sensitivity) -> bool:
        level = self.targets.get((tool, target))
        return level is not None and taint <= level


@dataclass
class OnceApproval:
    """A one-shot view layered over the session approvals, for re-deciding
    the same call after a person said `--once`."""

    base: ApprovalView
    kind: AskKind
    tool: str
    target: str
    taint: Sensitivity

    def permission_approved(self, tool: str) -> bool:
        return (self.kind == "permission" and tool == self.tool) or self.base.permission_approved(
            tool
        )

    def taint_approved(self, tool: str, target: str, taint: Sensitivity) -> bool:
        once = self.kind == "taint" and (tool, target) == (self.tool, self.target)
        return (once and taint <= self.taint) or self.base.taint_approved(tool, target, taint)


class ApprovalQueue:
    def __init__(
        self,
        *,
        agent_id: str,
        owner_uid: int,
        timeout: float,
        on_request: Callable[[PendingRequest], None] | None = None,
        on_resolved: Callable[[PendingRequest, Answer, int | None], None] | None = None,
        max_pending: int = 8,
    ) -> None:
        self.agent_id = agent_id
        # Each held call is a prompt on a person's screen and a bus signal:
        # an agent may not queue them without end.
        self.max_pending = max_pending
        self.owner_uid = owner_uid
        self.timeout = timeout
        self.session = SessionApprovals()
        self._on_request = on_request
        self._on_resolved = on_resolved
        self._held: dict[str, _Held] = {}

    def pending(self) -> list[PendingRequest]:
        return [held.request for held in self._held.values()]

    async def ask(
        self,
        *,
        kind: AskKind,
        tool: str,
        target: str,
        taint: Sensitivity,
        clearance: Sensitivity | None,
        rule: str,
        detail: str = "",
        scope: str = "",
    ) -> Answer:
        if len(self._held) >= self.max_pending:
            raise LimitExceeded(
                "max_pending_approvals", self.max_pending,
                f"{len(self._held)} calls already wait for a person "
                f"(limit max_pending_approvals = {self.max_pending})",
            )
        request = PendingRequest(
            id=secrets.token_hex(8),
            agent_id=self.agent_id,
            owner_uid=self.owner_uid,
            kind=kind,
            tool=tool,
            target=target,
            taint=taint,
            clearance=clearance,
            rule=rule,
            created=time.time(),
            detail=detail,
            scope=scope or target,
        )
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        held = _Held(request, future)
        self._held[request.id] = held
        metrics.approvals_waiting(+1)
        try:
            if self._on_request is not None:
                self._on_request(request)
            answer = await asyncio.wait_for(asyncio.shield(future), self.timeout)
        except TimeoutError:
            answer = Answer.DENY
        finally:
            self._held.pop(request.id, None)
            metrics.approvals_waiting(-1)
        if answer is Answer.SESSION:
            if kind == "permission":
                self.session.tools.add(tool)
            else:
                key = (tool, scope or target)
                self.session.targets[key] = max(taint, self.session.targets.get(key, taint))
        if self._on_resolved is not None:
            self._on_resolved(request, answer, held.answered_by)
        return answer

    def answer(self, request_id: str, answer: Answer, by_uid: int, *,
               admin: bool = False) -> PendingRequest:
        """`admin`: whoever answers holds the right to answer anyone's (asked
        by the caller of this method; this check is synchronous)."""
        held = self._held.get(request_id)
        if held is None:
            raise NotFound(f"no pending approval {request_id!r}")
        if by_uid != self.owner_uid and not admin:
            raise AccessDenied(
                f"approval {request_id} belongs to uid {self.owner_uid}'s agent; "
                "only its owner or an admin may answer it"
            )
        if not held.future.done():
            held.answered_by = by_uid
            held.future.set_result(answer)
        return held.request
