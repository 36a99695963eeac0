"""The systemd manager on the system bus, through dbus-fast: transient scopes
for agents, stopping them, and reading what systemd knows about them."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from leviathd import safetext
from leviathd.errors import LeviathError, Unavailable

SYSTEMD = "org.freedesktop.systemd1"
MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER_IFACE = "org.freedesktop.systemd1.Manager"
UNIT_IFACE = "org.freedesktop.systemd1.Unit"
SCOPE_IFACE = "org.freedesktop.systemd1.Scope"
UINT64_MAX = 2**64 - 1
# A scope's job: looked after in JOB_LOOK slices (its JobRemoved may never
# come), given up on after JOB_PATIENCE, by name. One bare 30 s wait ended a
# start as "internal error in leviathd" when it ran out.
JOB_LOOK = 5.0
JOB_PATIENCE = 120.0
# What the bus says of a job path systemd no longer has.
_JOB_GONE = ("org.freedesktop.DBus.Error.UnknownObject", "org.freedesktop.DBus.Error.UnknownMethod",
             "org.freedesktop.systemd1.NoSuchJob")


class SystemdError(LeviathError):
    dbus_name = "org.leviath.Error.Systemd"


@dataclass(frozen=True)
class ScopeLimits:
    memory_max: int | None = None
    tasks_max: int | None = None
    cpu_quota_percent: int | None = None
    cpu_weight: int | None = None


@dataclass(frozen=True)
class UnitState:
    name: str
    active_state: str
    memory_current: int | None
    tasks_current: int | None
    control_group: str
    memory_max: int | None = None  # None: infinity
    tasks_max: int | None = None


def scope_properties(
    *, pids: list[int], slice_name: str, description: str, limits: ScopeLimits,
    oom_policy: bool = True,
) -> list[tuple[str, Variant]]:
    # systemd writes these into /run/systemd/transient/ unescaped and reads
    # them back at daemon-reload: the strings go through the boundary again.
    props: list[tuple[str, Variant]] = [
        ("PIDs", Variant("au", pids)),
        ("Slice", Variant("s", safetext.check_unit_name(slice_name))),
        ("Description", Variant("s", safetext.description(description))),
        # An OOM-killed or failed agent must not linger as a failed unit.
        ("CollectMode", Variant("s", "inactive-or-failed")),
        # `lev stop` is SIGTERM then, after this, SIGKILL.
        ("TimeoutStopUSec", Variant("t", 10_000_000)),
        ("MemoryAccounting", Variant("b", True)),
        ("TasksAccounting", Variant("b", True)),
    ]
    if oom_policy:
        # systemd 253+ applies DefaultOOMPolicy=stop to scopes: one process
        # the kernel kills at MemoryMax (the agent's, or one of its compilers)
        # would stop the whole scope, supervisor included, and the agent
        # would end with no exit status (seen on Debian 13's systemd 257).
        # The kernel's kill of the process that overran is the limit.
        props.append(("OOMPolicy", Variant("s", "continue")))
    if limits.memory_max is not None:
        props.append(("MemoryMax", Variant("t", limits.memory_max)))
        # Swap would let a memory hog outlive its limit for minutes.
        props.append(("MemorySwapMax", Variant("t", 0)))
    if limits.tasks_max is not None:
        props.append(("TasksMax", Variant("t", limits.tasks_max)))
    if limits.cpu_quota_percent is not None:
        props.append(("CPUQuotaPerSecUSec", Variant("t", limits.cpu_quota_percent * 10_000)))
    if limits.cpu_weight is not None:
        props.append(("CPUWeight", Variant("t", limits.cpu_weight)))
    return props


class SystemdManager:
    """One connection's view of PID 1. `attach()` once before use: it
    subscribes to job results so that starting a scope can wait for it."""

    def __init__(self, bus: MessageBus) -> None:
        self._bus = bus
        self._job_waiters: dict[str, asyncio.Future[str]] = {}
        self._job_results: dict[str, str] = {}
        self._systemd_name = ""
        # False once PID 1 refused OOMPolicy for a scope (systemd before 253,
        # where scopes have none and the kernel's kill already ends there).
        self._oom_policy = True

    async def attach(self) -> None:
        self._bus.add_message_handler(self._on_message)
        await self._call_bus(
            "AddMatch",
            "s",
            [
                f"type='signal',sender='{SYSTEMD}',interface='{MANAGER_IFACE}',"
                "member='JobRemoved'"
            ],
        )
        # PID 1 gets a new unique name when it re-executes.
        await self._call_bus(
            "AddMatch",
            "s",
            [
                "type='signal',sender='org.freedesktop.DBus',interface='org.freedesktop.DBus',"
                f"member='NameOwnerChanged',arg0='{SYSTEMD}'"
            ],
        )
        (self._systemd_name,) = await self._call_bus("GetNameOwner", "s", [SYSTEMD])
        await self._call(MANAGER_PATH, MANAGER_IFACE, "Subscribe", "", [])

    def _on_message(self, msg: Message) -> bool:
        if (
            msg.message_type is MessageType.SIGNAL
            and msg.sender == "org.freedesktop.DBus"
            and msg.member == "NameOwnerChanged"
            and msg.signature == "sss"
            and msg.body[0] == SYSTEMD
        ):
            self._systemd_name = msg.body[2]
        # Any local user can send this daemon a signal naming any path and
        # interface (issue 20 §4): only the bus-stamped sender tells PID 1's
        # JobRemoved from a forged "failed" for every agent's start.
        if (
            msg.message_type is MessageType.SIGNAL
            and msg.sender == self._systemd_name
            and msg.path == MANAGER_PATH
            and msg.member == "JobRemoved"
            and msg.interface == MANAGER_IFACE
        ):
            _id, job, _unit, result = msg.body
            waiter = self._job_waiters.pop(job, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(result)
            else:
                # The reply to StartTransientUnit may come after the job ended.
                self._job_results[job] = result
                if len(self._job_results) > 256:
                    self._job_results.pop(next(iter(self._job_results)))
        return False

    async def _call_bus(self, member: str, signature: str, body: list[Any]) -> list[Any]:
        reply = await self._bus.call(
            Message(
                destination="org.freedesktop.DBus",
                path="/org/freedesktop/DBus",
                interface="org.freedesktop.DBus",
                member=member,
                signature=signature,
                body=body,
            )
        )
        assert reply is not None
        if reply.message_type is MessageType.ERROR:
            raise SystemdError(f"{member}: {reply.error_name}: {_error_text(reply)}")
        return list(reply.body)

    async def _call(
        self, path: str, interface: str, member: str, signature: str, body: list[Any]
    ) -> list[Any]:
        reply = await self._bus.call(
            Message(
                destination=SYSTEMD,
                path=path,
                interface=interface,
                member=member,
                signature=signature,
                body=body,
            )
        )
        assert reply is not None
        if reply.message_type is MessageType.ERROR:
            raise SystemdError(f"systemd {member}: {_error_text(reply)}", reply.error_name)
        return list(reply.body)

    async def start_scope(
        self, name: str, *, pids: list[int], slice_name: str, description: str,
        limits: ScopeLimits,
    ) -> None:
        """Create the scope around `pids` and wait until systemd reports the
        job done, so that the processes are in its cgroup with its limits."""
        while True:
            props = scope_properties(
                pids=pids, slice_name=slice_name, description=description, limits=limits,
                oom_policy=self._oom_policy,
            )
            try:
                (job,) = await self._call(
                    MANAGER_PATH, MANAGER_IFACE, "StartTransientUnit", "ssa(sv)a(sa(sv))",
                    [safetext.check_unit_name(name), "fail", props, []],
                )
                break
            except SystemdError as exc:
                if not (self._oom_policy and "OOMPolicy" in str(exc)):
                    raise
                self._oom_policy = False
        result = self._job_results.pop(job, None)
        if result is None:
            result = await self._job_result(job, name)
        if result != "done":
            raise SystemdError(f"starting {name} ended with result {result!r}")

    async def _job_result(self, job: str, name: str) -> str:
        """The result of the scope's job: from its JobRemoved signal, or,
        where that signal does not come within a look (a slow PID 1 under
        load, or a signal the bus dropped), from systemd itself: a job it no
        longer has is over, and the unit's state tells how. A job still
        there after JOB_PATIENCE is an error the caller can read, never a
        bare timeout (an "internal error" on the bus)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[str] = loop.create_future()
        self._job_waiters[job] = waiter
        deadline = loop.time() + JOB_PATIENCE
        try:
            while True:
                left = deadline - loop.time()
                with contextlib.suppress(TimeoutError):
                    return await asyncio.wait_for(asyncio.shield(waiter),
                                                  timeout=max(0.0, min(JOB_LOOK, left)))
                if not await self._job_exists(job):
                    if waiter.done():
                        return waiter.result()
                    state = await self.unit_state(name)
                    return "done" if state is not None and state.active_state in (
                        "active", "reloading") else "failed"
                if left <= JOB_LOOK:
                    raise Unavailable(
                        f"systemd has not started {name} after {JOB_PATIENCE:.0f} s (the "
                        "machine is busy); nothing of the agent was started, try again")
        finally:
            self._job_waiters.pop(job, None)

    async def _job_exists(self, job: str) -> bool:
        try:
            await self._call(job, "org.freedesktop.DBus.Properties", "Get", "ss",
                             ["org.freedesktop.systemd1.Job", "State"])
        except SystemdError as exc:
            if len(exc.args) > 1 and exc.args[1] in _JOB_GONE:
                return False
            raise
        return True

    async def stop_unit(self, name: str) -> None:
        if not _ours(name):
            return  # no unit the daemon makes is named so
        try:
            await self._call(MANAGER_PATH, MANAGER_IFACE, "StopUnit", "ss", [name, "replace"])
        except SystemdError as exc:
            if _is_no_such_unit(exc):
                return
            raise

    async def unit_names(self, states: list[str], patterns: list[str], limit: int) -> list[str]:
        """Names of the units in one of `states` matching one of `patterns`
        (at most `limit`)."""
        (rows,) = await self._call(
            MANAGER_PATH, MANAGER_IFACE, "ListUnitsByPatterns", "asas", [states, patterns]
        )
        return [str(row[0]) for row in rows[:limit]]

    async def unit_state(self, name: str) -> UnitState | None:
        if not _ours(name):
            return None
        try:
            (path,) = await self._call(MANAGER_PATH, MANAGER_IFACE, "GetUnit", "s", [name])
        except SystemdError as exc:
            if _is_no_such_unit(exc):
                return None
            raise
        (unit_props,) = await self._call(
            path, "org.freedesktop.DBus.Properties", "GetAll", "s", [UNIT_IFACE]
        )
        (scope_props,) = await self._call(
            path, "org.freedesktop.DBus.Properties", "GetAll", "s", [SCOPE_IFACE]
        )
        return UnitState(
            name=name,
            active_state=str(unit_props["ActiveState"].value),
            memory_current=_counter(scope_props.get("MemoryCurrent")),
            tasks_current=_counter(scope_props.get("TasksCurrent")),
            memory_max=_counter(scope_props.get("MemoryMax")),
            tasks_max=_counter(scope_props.get("TasksMax")),
            control_group=str(scope_props["ControlGroup"].value)
            if "ControlGroup" in scope_props
            else "",
        )



def _ours(name: str) -> bool:
    try:
        safetext.check_unit_name(name)
    except LeviathError:
        return False
    return True


def _counter(v: Variant | None) -> int | None:
    if v is None:
        return None
    n = int(v.value)
    return None if n == UINT64_MAX else n


def _error_text(reply: Message) -> str:
    return str(reply.body[0]) if reply.body else str(reply.error_name)


def _is_no_such_unit(exc: SystemdError) -> bool:
    return len(exc.args) > 1 and exc.args[1] == "org.freedesktop.systemd1.NoSuchUnit"
