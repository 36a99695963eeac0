"""How the daemon waits for systemd to start an agent's scope
(systemd/manager.py `start_scope`) when PID 1's JobRemoved signal does not
come: late under load, or dropped by the bus. A stand-in bus answers the
manager's calls (the real systemd is in tests/integration); it never sends
the signal unless a test says so."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from dbus_fast import Message, MessageType, Variant

from leviathd.errors import Unavailable
from leviathd.systemd import manager
from leviathd.systemd.manager import ScopeLimits, SystemdError, SystemdManager

UNIT = "leviath-alice-demo-0123abcd.scope"
JOB = "/org/freedesktop/systemd1/job/42"
PID1 = ":1.1"


class StandInBus:
    """Answers StartTransientUnit with JOB; the job exists while `job_left`
    looks (then systemd says there is no such object); the unit's state is
    `state`. `signal`: a JobRemoved result sent after the start's reply."""

    def __init__(self, *, job_left: int, state: str | None, signal: str | None = None) -> None:
        self.job_left = job_left
        self.state = state
        self.signal = signal
        self.handlers: list[Any] = []
        self.looks = 0
        self.serial = 0

    def add_message_handler(self, handler: Any) -> None:
        self.handlers.append(handler)

    async def call(self, msg: Message) -> Message:
        self.serial += 1
        msg.serial = self.serial  # as the bus would have numbered it
        if msg.member == "StartTransientUnit":
            if self.signal is not None:
                asyncio.get_running_loop().call_later(0.05, self._job_removed, self.signal)
            return Message.new_method_return(msg, "o", [JOB])
        if msg.path == JOB:
            self.looks += 1
            if self.looks <= self.job_left:
                return Message.new_method_return(msg, "v", [Variant("s", "running")])
            return Message.new_error(msg, "org.freedesktop.DBus.Error.UnknownObject",
                                     f"Unknown object '{JOB}'.")
        if msg.member == "GetUnit":
            if self.state is None:
                return Message.new_error(msg, "org.freedesktop.systemd1.NoSuchUnit",
                                         f"Unit {UNIT} not loaded.")
            return Message.new_method_return(msg, "o", ["/org/freedesktop/systemd1/unit/x"])
        if msg.member == "GetAll" and msg.body == [manager.UNIT_IFACE]:
            return Message.new_method_return(
                msg, "a{sv}", [{"ActiveState": Variant("s", self.state or "inactive")}])
        if msg.member == "GetAll":
            return Message.new_method_return(msg, "a{sv}", [{}])
        raise AssertionError(f"unexpected call {msg.member}")

    def _job_removed(self, result: str) -> None:
        signal = Message(message_type=MessageType.SIGNAL, sender=PID1,
                         path=manager.MANAGER_PATH, interface=manager.MANAGER_IFACE,
                         member="JobRemoved", signature="uoss", body=[42, JOB, UNIT, result])
        for handler in self.handlers:
            handler(signal)


def _start(bus: StandInBus) -> None:
    systemd = SystemdManager(bus)  # type: ignore[arg-type]
    systemd._systemd_name = PID1
    bus.add_message_handler(systemd._on_message)

    async def go() -> None:
        await systemd.start_scope(UNIT, pids=[1], slice_name="leviath.slice",
                                  description="test", limits=ScopeLimits())
    asyncio.run(asyncio.wait_for(go(), timeout=20))


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager, "JOB_LOOK", 0.1, raising=False)
    # Far more than the few looks these cases take, even on a loaded machine.
    monkeypatch.setattr(manager, "JOB_PATIENCE", 10.0, raising=False)


def test_a_started_scope_whose_job_signal_never_came_is_started() -> None:
    # The signal was lost; systemd no longer has the job and the unit runs.
    bus = StandInBus(job_left=2, state="active")
    _start(bus)
    assert bus.looks == 3


def test_a_failed_scope_whose_job_signal_never_came_fails_by_name() -> None:
    with pytest.raises(SystemdError, match="result 'failed'"):
        _start(StandInBus(job_left=0, state=None))


def test_a_job_systemd_never_finishes_is_a_readable_error_not_a_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A bare TimeoutError reaches the caller as "internal error in leviathd".
    monkeypatch.setattr(manager, "JOB_PATIENCE", 0.5)
    with pytest.raises(Unavailable, match=r"has not started .* try again"):
        _start(StandInBus(job_left=10**6, state="active"))


def test_the_job_signal_still_decides_when_it_comes() -> None:
    with pytest.raises(SystemdError, match="result 'dependency'"):
        _start(StandInBus(job_left=10**6, state="active", signal="dependency"))
    _start(StandInBus(job_left=10**6, state="inactive", signal="done"))
