"""Who is calling (leviathd/bus/caller.py), against a real dbus-daemon: a
client may name anyone in its message, leave before it is answered, or call
from a second connection; the daemon must only ever believe the bus."""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

import pytest
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface
from session_bus import bus_address

from leviathd.authority import Caller
from leviathd.bus import caller
from leviathd.bus.compat import DBusSignature, dbus_method
from leviathd.errors import AccessDenied

__all__ = ["bus_address"]

Str = Annotated[str, DBusSignature("s")]
IFACE = "org.leviath.test.Who"


class Who(ServiceInterface):
    """Answers with who the daemon believes is calling, and what the message
    body claimed."""

    def __init__(self, bus: MessageBus) -> None:
        super().__init__(IFACE)
        self.bus = bus
        self.seen: list[Caller] = []

    @dbus_method()
    async def Ask(self, claimed: Str) -> Str:
        who = await caller.current(self.bus)
        again = await caller.current(self.bus)  # the second ask uses the first answer
        assert again == who
        self.seen.append(who)
        return f"{who.sender} {who.uid} {who.pid}"


async def _serve(address: str) -> tuple[MessageBus, Who]:
    server = await MessageBus(bus_address=address).connect()
    caller.install(server)
    who = Who(server)
    server.export("/w", who)
    return server, who


async def _ask(client: MessageBus, server: MessageBus, claimed: str) -> Message:
    reply = await client.call(Message(
        destination=server.unique_name, path="/w", interface=IFACE, member="Ask",
        signature="s", body=[claimed],
    ))
    assert reply is not None
    return reply


def test_the_caller_is_the_bus_sender_and_the_bus_says_its_uid_and_pid(
    bus_address: str,
) -> None:
    async def go() -> None:
        server, who = await _serve(bus_address)
        first = await MessageBus(bus_address=bus_address).connect()
        second = await MessageBus(bus_address=bus_address).connect()
        # Each connection claims to be the other (and root): the body is never read.
        r1 = await _ask(first, server, f"{second.unique_name} 0")
        r2 = await _ask(second, server, f"{first.unique_name} 0")
        r3 = await _ask(first, server, "")
        assert r1.body == [f"{first.unique_name} {os.getuid()} {os.getpid()}"], r1.body
        assert r2.body == [f"{second.unique_name} {os.getuid()} {os.getpid()}"], r2.body
        assert r3.body == r1.body
        assert [w.sender for w in who.seen] == [
            first.unique_name, second.unique_name, first.unique_name]
        for bus in (first, second, server):
            bus.disconnect()

    asyncio.run(go())


def test_a_signal_from_another_connection_does_not_become_the_sender(
    bus_address: str,
) -> None:
    async def go() -> None:
        server = await MessageBus(bus_address=bus_address).connect()
        caller.install(server)
        other = await MessageBus(bus_address=bus_address).connect()
        seen: list[str] = []

        def after(msg: Message) -> bool:
            if msg.member == "Poke":
                seen.append(caller.sender())
            return False

        server.add_message_handler(after)
        await other.send(Message(
            destination=server.unique_name, path="/w", interface=IFACE, member="Poke",
            message_type=MessageType.SIGNAL,
        ))
        await other.call(Message(
            destination=server.unique_name, path="/w", interface=IFACE, member="Poke",
        ))
        assert seen == ["", other.unique_name], seen
        other.disconnect()
        server.disconnect()

    asyncio.run(go())


def test_outside_a_call_nobody_is_calling(bus_address: str) -> None:
    async def go() -> None:
        bus = await MessageBus(bus_address=bus_address).connect()
        assert caller.sender() == ""
        with pytest.raises(AccessDenied):
            await caller.current(bus)
        bus.disconnect()

    asyncio.run(go())


def test_a_caller_that_left_before_it_was_asked_about_is_refused(bus_address: str) -> None:
    """A client that sends its call and disconnects at once: its unique name
    is gone when the daemon asks the bus, and it must be nobody, not a crash
    and not whoever was resolved before."""

    async def go() -> None:
        bus = await MessageBus(bus_address=bus_address).connect()
        gone = await MessageBus(bus_address=bus_address).connect()
        name = gone.unique_name
        assert name is not None
        gone.disconnect()
        await asyncio.sleep(0.05)
        caller._sender.set(name)
        with pytest.raises(AccessDenied):
            await caller.current(bus)
        bus.disconnect()

    asyncio.run(go())


def test_a_caller_resolved_earlier_in_the_context_is_not_reused_for_another_sender(
    bus_address: str,
) -> None:
    async def go() -> None:
        bus = await MessageBus(bus_address=bus_address).connect()
        other = await MessageBus(bus_address=bus_address).connect()
        assert bus.unique_name is not None and other.unique_name is not None
        # Resolved once for one connection (as uid 4242)...
        first = Caller(sender=bus.unique_name, uid=4242, pid=1)
        caller._resolved.set(first)
        caller._sender.set(bus.unique_name)
        assert await caller.current(bus) is first
        # ...a later call in the same context from another connection is asked
        # about afresh, not taken for uid 4242.
        caller._sender.set(other.unique_name)
        who = await caller.current(bus)
        assert who == Caller(sender=other.unique_name, uid=os.getuid(), pid=os.getpid())
        other.disconnect()
        bus.disconnect()

    asyncio.run(go())


def test_a_connection_is_asked_about_once_and_only_on_its_own_bus(bus_address: str) -> None:
    """Calls are counted by uid before they run (bounds.PER_UID), so the
    answer is kept per connection and a connection's first calls, sent
    together, share one question; another connection's name is not taken
    from it, and the answer was the bus's (the uid of this process)."""

    asked: list[str] = []

    class Counting(MessageBus):
        async def call(self, msg: Message) -> Message | None:
            if msg.member == "GetConnectionCredentials":
                asked.append(str(msg.body[0]))
            return await super().call(msg)

    async def go() -> None:
        bus = await Counting(bus_address=bus_address).connect()
        a = await MessageBus(bus_address=bus_address).connect()
        b = await MessageBus(bus_address=bus_address).connect()

        async def one(name: str) -> Caller:
            caller._sender.set(name)
            caller._resolved.set(None)
            return await caller.current(bus)

        assert a.unique_name is not None and b.unique_name is not None
        got = await asyncio.gather(*(one(a.unique_name) for _ in range(20)))
        assert {w.sender for w in got} == {a.unique_name}
        assert {w.uid for w in got} == {os.getuid()}
        assert asked == [a.unique_name]
        await one(a.unique_name)
        assert asked == [a.unique_name]
        assert (await one(b.unique_name)).sender == b.unique_name
        assert asked == [a.unique_name, b.unique_name]
        for conn in (bus, a, b):
            conn.disconnect()

    asyncio.run(go())
