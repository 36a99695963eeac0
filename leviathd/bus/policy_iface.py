"""org.leviath.Policy1 (on /org/leviath/Manager1): approvals of held tool
calls and the machine-wide allowlist. It only translates between the bus and
the services: who may answer what is gate/answers.py's, the writes to
/etc/leviath and their reload config/machine_policy.py's; each method is
handed its caller and an Authority limited to what it declares."""

from typing import Annotated, Any

from dbus_fast import Variant
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface

from leviathd.agents.service import Agents
from leviathd.authority import Call, Right
from leviathd.bus import bounds, names
from leviathd.bus.compat import DBusSignature, dbus_signal
from leviathd.bus.method import bus_method
from leviathd.config.machine_policy import MachinePolicy
from leviathd.gate.answers import Answers
from leviathd.gate.service import GateService
from leviathd.policy.approvals import PendingRequest

VarDictList = Annotated[list[dict[str, Variant]], DBusSignature("aa{sv}")]
Str = Annotated[str, DBusSignature("s")]
# An allowlist target is a glob over a URL or path: PATH_MAX is room enough.
MAX_TARGET = 4096
MAX_RULE = 4096  # a rule's condition compiles only up to this many characters


def request_to_variants(req: PendingRequest, user: str) -> dict[str, Variant]:
    return {
        "id": Variant("s", req.id),
        "agent": Variant("s", req.agent_id),
        "uid": Variant("u", req.owner_uid),
        "user": Variant("s", user),
        "kind": Variant("s", req.kind),
        "tool": Variant("s", req.tool),
        "target": Variant("s", req.target),
        "taint": Variant("s", str(req.taint)),
        "clearance": Variant("s", str(req.clearance) if req.clearance is not None else "-"),
        "rule": Variant("s", req.rule),
        "created": Variant("d", req.created),
        "detail": Variant("s", req.detail),
        "scope": Variant("s", req.scope),
    }


class PolicyInterface(ServiceInterface):
    def __init__(self, bus: MessageBus, agents: Agents, gate: GateService,
                 answers: Answers, machine: MachinePolicy) -> None:
        super().__init__(names.POLICY_IFACE)
        self._bus = bus
        self._agents = agents
        self._answers = answers
        self._machine = machine
        gate.on_approval_requested.append(self._emit)

    def _emit(self, req: PendingRequest) -> None:
        # Signals on the system bus reach every subscriber: say only that a
        # call waits. What it is (tool, target) is for ListApprovals, which
        # shows a request to its owner and admins only.
        self.ApprovalRequested(req.id, req.agent_id, req.owner_uid)

    def _user(self, agent_id: str) -> str:
        rec = self._agents.records.get(agent_id)
        return rec.user if rec is not None else ""

    @bus_method(asks=(Right.ANSWER_ANY,))
    async def ListApprovals(self, call: Call) -> VarDictList:
        """Pending approvals of the caller's agents (everyone's with
        org.leviath.approval.answer-any)."""
        return [request_to_variants(r, self._user(r.agent_id))
                for r in await self._answers.pending(call)]

    @bus_method(asks=(Right.ANSWER_ANY,), control="answer a held call")
    async def Answer(self, call: Call, request_id: Str, answer: Str) -> None:
        """Answer a held call: once, session or deny. The agent's owner may;
        anyone else needs org.leviath.approval.answer-any (without it the
        request does not exist for them)."""
        request_id = bounds.request_id(request_id)
        answer = bounds.text(answer, 16, "answer")
        await self._answers.answer(call, request_id, answer)

    @bus_method(needs=Right.CONFIG_MANAGE, what="change the machine-wide tool policy",
                control="change the machine-wide tool policy")
    async def PolicyAdd(self, call: Call, tool: Str, target: Str, max_sensitivity: Str) -> Str:
        """Append an [[allowlist]] rule to the machine config (needs
        org.leviath.config.manage). The file is parsed before it atomically
        replaces the old one; the next run uses it. Returns the file's path."""
        tool = bounds.text(tool, 64, "tool")
        target = bounds.text(target, MAX_TARGET, "target")
        max_sensitivity = bounds.text(max_sensitivity, 32, "sensitivity")
        return str(await self._machine.add_allow(call, tool, target, max_sensitivity))

    @bus_method(needs=Right.CONFIG_MANAGE, what="change the machine-wide tool policy",
                control="change the machine-wide tool policy")
    async def RuleAdd(self, call: Call, name: Str, when: Str, decision: Str, reason: Str) -> Str:
        """Append a machine [[rules]] policy rule to
        /etc/leviath/rules.d/50-lev-policy-add.toml (needs
        org.leviath.config.manage). Checked with the machine config and every
        rules.d file before it replaces the file atomically; then reloaded.
        Returns the file's path."""
        name = bounds.text(name, 64, "name")
        when = bounds.text(when, MAX_RULE, "when")
        decision = bounds.text(decision, 8, "decision")
        reason = bounds.text(reason, 200, "reason")
        return str(await self._machine.add_rule(call, name, when, decision, reason))

    @bus_method(asks=(Right.CONFIG_MANAGE, Right.RUN))
    async def PolicyList(self, call: Call) -> VarDictList:
        """The machine config's allowlist rules as in force (to admins and
        people who may run agents: config/machine_policy.py)."""
        return [
            {"tool": Variant("s", r.tool), "target": Variant("s", r.target),
             "max_sensitivity": Variant("s", str(r.max_sensitivity)),
             "source": Variant("s", "machine")}
            for r in await self._machine.allowlist(call)
        ]

    @dbus_signal()
    def ApprovalRequested(
        self, request_id: str, agent_id: str, uid: int
    ) -> Annotated[list[Any], DBusSignature("ssu")]:
        return [request_id, agent_id, uid]
