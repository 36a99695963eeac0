"""leviathd.bus.compat against a real dbus-daemon, with whichever dbus-fast is
installed: CI runs this file with the dev venv's PyPI release and, inside the
Debian 13 VM, with Debian's python3-dbus-fast 2.44 (which has no
dbus_fast.annotations and received only the first of several descriptors)."""

from __future__ import annotations

import asyncio
import os
from typing import Annotated, Any

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus
from dbus_fast.constants import PropertyAccess
from dbus_fast.introspection import Node
from dbus_fast.service import ServiceInterface
from session_bus import bus_address

from leviathd.bus.compat import DBusSignature, dbus_method, dbus_property, dbus_signal, many_fds
from leviathd.bus.names import MANAGER_IFACE, OBJECT_PATH

__all__ = ["bus_address"]  # the fixture, used by name

Fd = Annotated[int, DBusSignature("h")]
Str = Annotated[str, DBusSignature("s")]
VarDict = Annotated[dict[str, Variant], DBusSignature("a{sv}")]


class Probe(ServiceInterface):
    """Manager1's name and RunAttached's shape: the daemon's bus closes the
    descriptors of any other call as they arrive (bus/fds.py)."""

    def __init__(self) -> None:
        super().__init__(MANAGER_IFACE)

    @dbus_method()
    async def RunAttached(self, request: VarDict, a: Fd, b: Fd, c: Fd) -> Annotated[
        list[Any], DBusSignature("ss")
    ]:
        for n, fd in enumerate((a, b, c)):
            os.write(fd, f"{request['word'].value}{n}".encode())
        return ["done", "ok"]

    @dbus_signal()
    def Happened(self, what: str) -> Str:
        return what

    @dbus_property(access=PropertyAccess.READ)
    def Version(self) -> Str:
        return "1"


def test_signatures_reach_the_bus_as_declared(bus_address: str) -> None:
    async def go() -> str:
        server = await many_fds(
            MessageBus(bus_address=bus_address, negotiate_unix_fd=True)
        ).connect()
        server.export(OBJECT_PATH, Probe())
        client = await MessageBus(bus_address=bus_address).connect()
        reply = await client.call(Message(
            destination=server.unique_name, path=OBJECT_PATH,
            interface="org.freedesktop.DBus.Introspectable", member="Introspect",
        ))
        return str(reply.body[0])

    iface = next(i for i in Node.parse(asyncio.run(go())).interfaces
                 if i.name == MANAGER_IFACE)
    (write,) = iface.methods
    assert [a.signature for a in write.in_args] == ["a{sv}", "h", "h", "h"]
    assert [a.signature for a in write.out_args] == ["s", "s"]
    assert [a.signature for a in iface.signals[0].args] == ["s"]
    assert [(p.name, p.signature, p.access) for p in iface.properties] == [
        ("Version", "s", PropertyAccess.READ)
    ]


def test_three_descriptors_in_one_call_all_arrive(bus_address: str) -> None:
    """Seen failing with dbus-fast 2.44 before many_fds: (fd, None, None)."""
    pipes = [os.pipe() for _ in range(3)]

    async def go() -> list[Any]:
        server = await many_fds(
            MessageBus(bus_address=bus_address, negotiate_unix_fd=True)
        ).connect()
        server.export(OBJECT_PATH, Probe())
        client = await MessageBus(bus_address=bus_address, negotiate_unix_fd=True).connect()
        reply = await client.call(Message(
            destination=server.unique_name, path=OBJECT_PATH, interface=MANAGER_IFACE,
            member="RunAttached", signature="a{sv}hhh",
            body=[{"word": Variant("s", "w")}, 0, 1, 2], unix_fds=[w for _, w in pipes],
        ))
        assert reply.message_type == MessageType.METHOD_RETURN, reply.body
        return list(reply.body)

    try:
        assert asyncio.run(go()) == ["done", "ok"]
        assert [os.read(r, 100) for r, _ in pipes] == [b"w0", b"w1", b"w2"]
    finally:
        for r, w in pipes:
            os.close(r)
            os.close(w)
