"""org.leviath.Manager1: the control API. It only translates between the bus
and `leviathd.agents.service.Agents` (and `config/reload.py` for Reload); each
method is handed its caller, from the bus, and an Authority limited to the
rights it declares, which is the one `Agents` asks (bus/method.py)."""

import asyncio
from typing import Annotated, Any

from dbus_fast import Variant
from dbus_fast.aio import MessageBus
from dbus_fast.constants import PropertyAccess
from dbus_fast.service import ServiceInterface

from leviathd import __version__, fdclose, listing, metrics
from leviathd.agents.request import RunInput
from leviathd.agents.service import Agents
from leviathd.authority import Call, Right
from leviathd.bus import bounds
from leviathd.bus.compat import DBusSignature, dbus_property, dbus_signal
from leviathd.bus.method import bus_method
from leviathd.bus.names import MANAGER_IFACE
from leviathd.config.reload import Cause, Reloads
from leviathd.errors import InvalidArgument
from leviathd.records import AgentRecord
from leviathd.sandbox.supervisor import Stdio

VarDict = Annotated[dict[str, Variant], DBusSignature("a{sv}")]
VarDictList = Annotated[list[dict[str, Variant]], DBusSignature("aa{sv}")]
Str = Annotated[str, DBusSignature("s")]
Bool = Annotated[bool, DBusSignature("b")]
Fd = Annotated[int, DBusSignature("h")]
IdAndUnit = Annotated[list[str], DBusSignature("ss")]
RowsAndCursor = Annotated[list[Any], DBusSignature("aa{sv}s")]
TextAndJson = Annotated[list[str], DBusSignature("ss")]
_OPTIONS = frozenset({"all", "cursor", "limit"})


def _option(options: dict[str, Variant], key: str, signature: str, default: Any) -> Any:
    unknown = set(options) - _OPTIONS
    if unknown:
        raise InvalidArgument(f"unknown option (known: {', '.join(sorted(_OPTIONS))})")
    value = options.get(key)
    if value is None:
        return default
    if value.signature != signature:
        raise InvalidArgument(f"option {key} must have type {signature}")
    return value.value


_ROWS: dict[str, tuple[tuple[object, ...], dict[str, Variant]]] = {}
_ROWS_MAX = 8192


def record_to_variants(rec: AgentRecord, live: dict[str, int | None]) -> dict[str, Variant]:
    """The row on the bus. Its record part is kept per record (what can
    change is the key): building ~15 Variants per agent in every List cost
    milliseconds at hundreds of agents (issue 18)."""
    key = (listing.memo_version(rec), *(live.get(name) for name in _LIVE))
    held = _ROWS.get(rec.id)
    if held is None or held[0] != key:
        if len(_ROWS) >= _ROWS_MAX:
            _ROWS.clear()
        row = _record_variants(rec)
        for name in _LIVE:
            value = live.get(name)
            if value is not None:
                row[name] = Variant("t", value)
        held = (key, row)
        _ROWS[rec.id] = held
    # A copy: the caller may add to it; the Variants themselves are shared.
    return dict(held[1])


_LIVE = ("memory", "tasks", "memory_max", "tasks_max")


def _record_variants(rec: AgentRecord) -> dict[str, Variant]:
    out: dict[str, Variant] = {
        "id": Variant("s", rec.id),
        "uid": Variant("u", rec.uid),
        "user": Variant("s", rec.user),
        "agent": Variant("s", rec.agent),
        "state": Variant("s", rec.state.value),
        "sandbox": Variant("s", rec.sandbox),
        "marks": Variant("as", list(rec.marks)),
        "reads_granted": Variant("u", rec.reads_granted),
        "reads_declared": Variant("u", rec.reads_declared),
        "unit": Variant("s", rec.unit),
        "workdir": Variant("s", rec.workdir),
        "command": Variant("as", list(rec.command)),
        "started_at": Variant("d", rec.started_at),
    }
    if rec.blueprint:
        out["blueprint"] = Variant("s", rec.blueprint)
    if rec.ended_at is not None:
        out["ended_at"] = Variant("d", rec.ended_at)
    if rec.exit_status is not None:
        out["exit_status"] = Variant("i", rec.exit_status)
    if rec.hook_changes:
        out["hook_changes"] = Variant("as", list(rec.hook_changes))
    return out


def _close_quietly(fd: int) -> None:
    # A caller's descriptor: off the loop (fdclose.py).
    fdclose.discard(fd)


def _parse_request(request: dict[str, Any]) -> RunInput:
    return RunInput.from_variants(request)


class ManagerInterface(ServiceInterface):
    def __init__(self, bus: MessageBus, agents: Agents, reloads: Reloads) -> None:
        super().__init__(MANAGER_IFACE)
        self._bus = bus
        self._agents = agents
        self._reloads = reloads

    @bus_method(asks=(Right.RUN, Right.RUN_UNSANDBOXED), control="start an agent")
    async def Run(self, call: Call, request: VarDict) -> IdAndUnit:
        """Start an agent as the caller, detached. Keys: command (as),
        blueprint (s, the blueprint.toml text), blueprint_source (s), workdir (s),
        env (a{ss}), sandbox (s: "" or "none"), workdir_mode (s)."""
        rec = await self._agents.run(call.who, _parse_request(request), Stdio())
        return [rec.id, rec.unit]

    @bus_method(asks=(Right.RUN, Right.RUN_UNSANDBOXED), control="start an agent")
    async def RunAttached(
        self, call: Call, request: VarDict, stdin: Fd, stdout: Fd, stderr: Fd
    ) -> IdAndUnit:
        """As Run, with the caller's terminal: output goes to the journal and
        to these descriptors, input comes from stdin."""
        stdio = Stdio(stdin=stdin, stdout=stdout, stderr=stderr)
        try:
            req = _parse_request(request)
        except BaseException:
            # Agents.run closes them from here on; a refused request must not
            # keep the caller's terminal (its reader would never see the end).
            for fd in stdio.fds():
                _close_quietly(fd)
            raise
        rec = await self._agents.run(call.who, req, stdio)
        return [rec.id, rec.unit]

    @bus_method(asks=(Right.RUN, Right.MANAGE_ANY), control="stop an agent")
    async def Stop(self, call: Call, agent_id: Str) -> None:
        agent_id = bounds.agent_id(agent_id)
        await self._agents.stop(call.who, agent_id)

    @bus_method(asks=(Right.MANAGE_ANY,))
    async def List(self, call: Call, all_agents: Bool) -> VarDictList:
        """The caller's agents (everyone's with org.leviath.agent.manage-any):
        those running, and with all_agents the most recently ended ones, as
        many as fit in one page (ListPage has the rest)."""
        rows, _cursor = await self._agents.list(call.who, include_ended=all_agents)
        return [record_to_variants(rec, live) for rec, live in rows]

    @bus_method(asks=(Right.MANAGE_ANY,))
    async def ListPage(self, call: Call, options: VarDict) -> RowsAndCursor:
        """One page of List. Options: all (b), cursor (s: "" for the first
        page, else the one the previous page returned), limit (u, at most
        1000). Returns the rows and the next cursor ("" after the last page).
        No reply exceeds 256 KiB."""
        all_agents = _option(options, "all", "b", False)
        cursor = bounds.text(_option(options, "cursor", "s", ""), 64, "cursor")
        limit = _option(options, "limit", "u", listing.DEFAULT_ROWS)
        rows, next_cursor = await self._agents.list(
            call.who, include_ended=bool(all_agents), cursor=str(cursor), limit=int(limit)
        )
        return [[record_to_variants(rec, live) for rec, live in rows], next_cursor]

    @bus_method(asks=(Right.RUN, Right.MANAGE_ANY))
    async def Get(self, call: Call, agent_id: Str) -> VarDict:
        agent_id = bounds.agent_id(agent_id)
        rec, live = await self._agents.get(call.who, agent_id)
        # As in List: a record with a huge command line is sent cut short.
        return record_to_variants(listing.trimmed(rec), live)

    @bus_method(asks=(Right.RUN, Right.MANAGE_ANY))
    async def Watch(self, call: Call, agent_id: Str) -> VarDict:
        """As Get; while the agent runs, the caller's connection also hears its
        AgentEnded (for a client that outlived a daemon restart)."""
        agent_id = bounds.agent_id(agent_id)
        rec = await self._agents.watch(call.who, agent_id)
        return record_to_variants(listing.trimmed(rec), {})

    @bus_method(asks=(Right.RUN, Right.MANAGE_ANY))
    async def Inspect(self, call: Call, agent_id: Str) -> Str:
        """What the agent sees: its sandbox spec for each step (seed commands,
        stages), as JSON: [{"label": ..., "spec": {...}}]."""
        agent_id = bounds.agent_id(agent_id)
        return await self._agents.inspect(call.who, agent_id)

    @bus_method(asks=(Right.RUN, Right.MANAGE_ANY))
    async def Logs(self, call: Call, agent_id: Str, follow: Bool) -> Fd:
        """A pipe carrying the agent's journal output; with follow, it stays
        open until the agent ends. Readers are capped per caller and in total
        and end with the caller's bus connection (leviathd/audit/readers.py)."""
        agent_id = bounds.agent_id(agent_id)
        fd = await self._agents.logs(call.who, agent_id, follow)
        # dbus-fast sends a duplicate through the socket but never closes ours;
        # the reply leaves at once, so closing a little later is safe.
        asyncio.get_running_loop().call_later(30, _close_quietly, fd)
        return fd

    @bus_method(asks=(Right.RUN, Right.MANAGE_ANY))
    async def Audit(self, call: Call, agent_id: Str, follow: Bool) -> Fd:
        """A pipe carrying the agent's audit records, one JSON object a line
        (journalctl's JSON output, limited to the LEVIATH_* fields), matched
        only on what journald stamps (leviathd/audit/trail.py); with follow, open
        until the agent ends."""
        agent_id = bounds.agent_id(agent_id)
        fd = await self._agents.audit(call.who, agent_id, follow)
        asyncio.get_running_loop().call_later(30, _close_quietly, fd)
        return fd

    @bus_method(needs=Right.MANAGE_ANY, what="read the daemon's figures")
    async def Stats(self, call: Call) -> TextAndJson:
        """The daemon's figures (agents running per user and kind, starts,
        refusals by layer, approvals waiting, proxy bytes and connections,
        injected requests per credential name, broker calls, descriptors and
        memory): the OpenMetrics text of the metrics file (leviathd/metrics.py)
        and the same samples as JSON. Everyone's: org.leviath.agent.manage-any."""
        families = self._agents.metric_families()

        def both() -> list[str]:
            import json

            every = [*families, *metrics.process_families()]
            return [metrics.render(every), json.dumps(metrics.rows(every))]

        return await asyncio.to_thread(both)

    @bus_method(needs=Right.CONFIG_MANAGE, what="reload the configuration",
                control="reload the configuration")
    async def Reload(self, call: Call) -> None:
        """Re-read /etc/leviath/config.toml (org.leviath.config.manage)."""
        self._reloads.reload(Cause.BUS, by_uid=call.who.uid)

    @dbus_signal()
    def AgentStarted(
        self, agent_id: str, unit: str, uid: int
    ) -> Annotated[list[Any], DBusSignature("ssu")]:
        return [agent_id, unit, uid]

    @dbus_signal()
    def AgentEnded(
        self, agent_id: str, exit_status: int, state: str
    ) -> Annotated[list[Any], DBusSignature("sis")]:
        return [agent_id, exit_status, state]

    @dbus_signal()
    def AgentHookChanges(
        self, agent_id: str, files: list[str]
    ) -> Annotated[list[Any], DBusSignature("sas")]:
        return [agent_id, files]

    @dbus_property(access=PropertyAccess.READ)
    def Version(self) -> Str:
        return __version__
