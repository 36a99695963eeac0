"""Issue 50: the daemon's own side of the bus (bus/bounded.py,
bus/caller_watch.py): its pending calls are capped below the bus's limit,
and only the bus driver's word ends a caller's readers (a client's forged
NameOwnerChanged is not)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from leviathd.bus.bounded import BoundedBus
from leviathd.bus.caller_watch import BUS_DRIVER, BusCallerWatch


@pytest.fixture
def address(tmp_path: Path) -> Iterator[str]:
    """A unix socket that listens and never answers: dbus-fast 2.44 (Debian
    13's) connects in MessageBus() itself, newer ones at connect()."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(tmp_path / "bus"))
    srv.listen()
    try:
        yield f"unix:path={tmp_path / 'bus'}"
    finally:
        srv.close()


def test_the_daemons_pending_calls_never_pass_the_cap(
    monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    async def go() -> int:
        release = asyncio.Event()
        now = peak = 0

        async def call(self: MessageBus, msg: Message) -> Message:
            nonlocal now, peak
            now += 1
            peak = max(peak, now)
            await release.wait()
            now -= 1
            return msg

        monkeypatch.setattr(MessageBus, "call", call)
        bus = BoundedBus(bus_address=address, max_pending=3)
        calls = [asyncio.ensure_future(bus.call(Message(path="/", member="M")))
                 for _ in range(10)]
        for _ in range(20):
            await asyncio.sleep(0)
        release.set()
        await asyncio.gather(*calls)
        return peak

    assert asyncio.run(go()) == 3


def _owner_changed(sender: str, name: str) -> Message:
    return Message(message_type=MessageType.SIGNAL, sender=sender, path="/org/freedesktop/DBus",
                   interface=BUS_DRIVER, member="NameOwnerChanged", signature="sss",
                   body=[name, name, ""])


def test_only_the_bus_driver_says_a_caller_has_gone(address: str) -> None:
    async def go() -> list[str]:
        watch = BusCallerWatch(MessageBus(bus_address=address))
        gone: list[str] = []
        watch.on_gone(gone.append)
        watch._on_message(_owner_changed(":1.66", ":1.42"))  # a client's forgery
        assert gone == []
        watch._on_message(_owner_changed(BUS_DRIVER, ":1.42"))
        return gone

    assert asyncio.run(go()) == [":1.42"]
