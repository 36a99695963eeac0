"""org.leviath.Policy1 (on /org/leviath/Manager1): approvals of held tool
calls and the machine-wide allowlist. Each method is handed its caller, from
the bus, and an Authority limited to the rights it declares (bus/method.py);
decisions come from polkit through it and from the gate service."""

import asyncio
from pathlib import Path
from typing import Annotated, Any

from dbus_fast import Variant
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface

from leviathd.agents.service import Agents
from leviathd.authority import Call, Right
from leviathd.bus import bounds, names
from leviathd.bus.compat import DBusSignature, dbus_signal
from leviathd.bus.method import bus_method
from leviathd.config.edit import add_machine_rule, append_rule, machine_write_target
from leviathd.domain.sensitivity import Sensitivity
from leviathd.domain.tools import checked_tool_name
from leviathd.errors import InvalidArgument, NotFound
from leviathd.events import Event
from leviathd.gate.service import GateService
from leviathd.paths import machine_config_path
from leviathd.policy.approvals import Answer, PendingRequest
from leviathd.systemd import journal

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
    def __init__(self, bus: MessageBus, agents: Agents, gate: GateService) -> None:
        super().__init__(names.POLICY_IFACE)
        self._bus = bus
        self._agents = agents
        self._gate = gate
        gate.on_approval_requested.append(self._emit)
        self._lock = asyncio.Lock()

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
        who = call.who
        everyone = await call.authority.allowed(who, Right.ANSWER_ANY)
        return [request_to_variants(r, self._user(r.agent_id))
                for r in self._gate.pending(None if everyone else who.uid)]

    @bus_method(asks=(Right.ANSWER_ANY,))
    async def Answer(self, call: Call, request_id: Str, answer: Str) -> None:
        """Answer a held call: once, session or deny. The agent's owner may;
        anyone else needs org.leviath.approval.answer-any (without it the
        request does not exist for them)."""
        request_id = bounds.request_id(request_id)
        answer = bounds.text(answer, 16, "answer")
        who = call.who
        parsed = Answer.parse(answer)
        req = self._gate.find(request_id)
        if req is None:
            raise NotFound(f"no pending approval {request_id!r}")
        admin = False
        if req.owner_uid != who.uid:
            admin = await call.authority.allowed(who, Right.ANSWER_ANY)
            if not admin:
                raise NotFound(f"no pending approval {request_id!r}")
        self._gate.answer(request_id, parsed, who.uid, admin=admin)

    @bus_method(needs=Right.CONFIG_MANAGE, what="change the machine-wide tool policy")
    async def PolicyAdd(self, call: Call, tool: Str, target: Str, max_sensitivity: Str) -> Str:
        """Append an [[allowlist]] rule to the machine config (needs
        org.leviath.config.manage). The file is parsed before it atomically
        replaces the old one; the next run uses it. Returns the file's path."""
        tool = bounds.text(tool, 64, "tool")
        target = bounds.text(target, MAX_TARGET, "target")
        max_sensitivity = bounds.text(max_sensitivity, 32, "sensitivity")
        who = call.who
        level = Sensitivity.parse(max_sensitivity)
        if not target or "\0" in target or "\n" in target:
            raise InvalidArgument("target must be a non-empty single-line glob")
        tool = checked_tool_name(tool)  # any tool may be named; unknown ones fail closed
        path: Path = machine_config_path()
        async with self._lock:  # two writers must not lose each other's rule
            real = await asyncio.to_thread(machine_write_target, path)
            try:
                await asyncio.to_thread(append_rule, real, tool, target, level)
            except OSError as exc:
                raise InvalidArgument(f"cannot write {real}: {exc.strerror}") from None
            self._agents.load_machine_config()
        journal.record(
            f"allowlist rule added to {real} by uid {who.uid}: {tool} {target!r} up to {level}",
            LEVIATH_EVENT=Event.POLICY_ADD, LEVIATH_BY_UID=who.uid, LEVIATH_TOOL=tool,
            LEVIATH_TARGET=target,
        )
        return str(real)

    @bus_method(needs=Right.CONFIG_MANAGE, what="change the machine-wide tool policy")
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
        who = call.who
        if decision not in ("allow", "deny", "ask"):
            raise InvalidArgument("decision must be allow, deny or ask")
        path = Path(machine_config_path())
        async with self._lock:
            try:
                where = await asyncio.to_thread(add_machine_rule, path, name, when, decision,
                                                reason)
            except OSError as exc:
                raise InvalidArgument(f"cannot write the rule: {exc.strerror}") from None
            self._agents.load_machine_config()
        journal.record(
            f"policy rule {name!r} ({decision}) added to {where} by uid {who.uid}",
            LEVIATH_EVENT=Event.RULE_ADD, LEVIATH_BY_UID=who.uid,
            LEVIATH_RULE=f"rule:machine:{name}",
        )
        return str(where)

    @bus_method(asks=(Right.CONFIG_MANAGE, Right.RUN))
    async def PolicyList(self, call: Call) -> VarDictList:
        """The machine config's allowlist rules as in force. The file may be
        0600: the rules are for whoever they apply to, that is admins and
        people who may run agents (every rule applies to every agent), and
        nobody else."""
        if not await call.authority.allowed(call.who, Right.CONFIG_MANAGE):
            await call.authority.require(call.who, Right.RUN, "read the tool policy")
        return [
            {"tool": Variant("s", r.tool), "target": Variant("s", r.target),
             "max_sensitivity": Variant("s", str(r.max_sensitivity)),
             "source": Variant("s", "machine")}
            for r in self._agents.machine_config.allowlist
        ]

    @dbus_signal()
    def ApprovalRequested(
        self, request_id: str, agent_id: str, uid: int
    ) -> Annotated[list[Any], DBusSignature("ssu")]:
        return [request_id, agent_id, uid]
