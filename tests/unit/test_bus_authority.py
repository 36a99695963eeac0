"""A bus method can ask polkit only for the rights it declares
(leviathd/bus/method.py, leviathd/authority.py): the Authority it is handed,
and the one the services built before any call ask (`ServedAuthority`), are
limited to its `needs` and `asks`. Asking for anything else is a bug, raised
as one (the client sees an internal error), never put to polkit. Against a
real dbus-daemon; the interfaces' own declarations are
tests/unit/test_bus_methods.py's."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Annotated

import pytest
from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus
from dbus_fast.service import ServiceInterface
from session_bus import bus_address

from leviathd.authority import Call, Caller, Limited, Right, UndeclaredRight
from leviathd.bus import caller
from leviathd.bus.compat import DBusSignature
from leviathd.bus.method import ServedAuthority, bus_method

__all__ = ["bus_address"]

ROOT = Path(__file__).resolve().parents[2]
IFACE = "org.leviath.test.Rights"
Str = Annotated[str, DBusSignature("s")]
Bool = Annotated[bool, DBusSignature("b")]


class _Recording:
    """Stands in for polkit: says yes, and remembers what it was asked."""

    def __init__(self) -> None:
        self.asked: list[Right] = []

    async def allowed(self, who: Caller, right: Right) -> bool:
        self.asked.append(right)
        return True

    async def require(self, who: Caller, right: Right, what: str) -> None:
        self.asked.append(right)


ALICE = Caller(sender=":1.7", uid=1000, pid=7)


def test_the_limited_authority_asks_only_what_was_declared() -> None:
    async def go() -> None:
        inner = _Recording()
        limited = Limited(inner, ALICE, {Right.RUN})
        assert await limited.allowed(ALICE, Right.RUN)
        await limited.require(ALICE, Right.RUN, "run agents")
        with pytest.raises(UndeclaredRight):
            await limited.allowed(ALICE, Right.MANAGE_ANY)
        with pytest.raises(UndeclaredRight):
            await limited.require(ALICE, Right.CONFIG_MANAGE, "reload")
        # Nor about anyone but the caller.
        with pytest.raises(UndeclaredRight):
            await limited.allowed(Caller(sender=":1.8", uid=1001, pid=8), Right.RUN)
        assert inner.asked == [Right.RUN, Right.RUN]

    asyncio.run(go())


def test_outside_a_bus_method_the_served_authority_answers_nothing() -> None:
    with pytest.raises(UndeclaredRight):
        asyncio.run(ServedAuthority().allowed(ALICE, Right.RUN))


class Rights(ServiceInterface):
    """Asks for the right it is told, through the Authority it is handed or,
    like Agents, through the ServedAuthority it was built with."""

    def __init__(self, bus: MessageBus) -> None:
        super().__init__(IFACE)
        self._bus = bus
        self._served = ServedAuthority()
        self.callers: list[Caller] = []

    @bus_method(asks=(Right.RUN,))
    async def Ask(self, call: Call, right: Str, served: Bool) -> Bool:
        self.callers.append(call.who)
        authority = self._served if served else call.authority
        return await authority.allowed(call.who, Right(right))


async def _serve(address: str) -> tuple[MessageBus, Rights]:
    server = await MessageBus(bus_address=address).connect()
    caller.install(server)
    rights = Rights(server)
    server.export("/r", rights)
    return server, rights


async def _ask(client: MessageBus, server: MessageBus, right: Right, served: bool) -> Message:
    reply = await client.call(Message(
        destination=server.unique_name, path="/r", interface=IFACE, member="Ask",
        signature="sb", body=[right.value, served],
    ))
    assert reply is not None
    return reply


def test_a_method_cannot_ask_a_right_it_did_not_declare(bus_address: str) -> None:
    async def go() -> None:
        server, rights = await _serve(bus_address)
        client = await MessageBus(bus_address=bus_address).connect()
        for served in (False, True):
            declared = await _ask(client, server, Right.RUN, served)
            assert declared.message_type is MessageType.METHOD_RETURN, declared.body
            for right in (Right.MANAGE_ANY, Right.CONFIG_MANAGE, Right.RUN_UNSANDBOXED):
                undeclared = await _ask(client, server, right, served)
                assert undeclared.message_type is MessageType.ERROR, (right, undeclared.body)
                assert undeclared.error_name == "org.leviath.Error.Failed", undeclared.body
        # The method was handed the caller the bus named.
        assert {w.sender for w in rights.callers} == {client.unique_name}
        client.disconnect()
        server.disconnect()

    asyncio.run(go())


def test_dbus_does_not_see_the_call_argument() -> None:
    methods = {m.name: m.in_signature for m in ServiceInterface._get_methods(Rights(None))}  # type: ignore[arg-type]
    assert methods == {"Ask": "sb"}


def test_the_interfaces_ask_polkit_only_through_their_call() -> None:
    """The interface modules neither ask polkit nor look up the caller
    themselves: both come with the call, so what a method declares is all
    it can ask (on main before this change, Policy1 asked polkit directly)."""
    for name in ("manager_iface.py", "policy_iface.py"):
        path = ROOT / "leviathd" / "bus" / name
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "leviathd.bus":
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
        assert not imported & {"polkit", "caller", "leviathd.bus.polkit",
                               "leviathd.bus.caller"}, (name, imported)


def test_a_refused_call_has_its_descriptors_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 50: a call refused before its method's body (here: no caller
    the bus can name, outside any bus call) has the descriptors it carried
    closed by bus_method, not left to the method that never ran."""
    from dbus_fast.errors import DBusError

    from leviathd import fdclose

    discarded: list[int] = []
    monkeypatch.setattr(fdclose, "discard", discarded.append)

    class Service:
        _bus = None

        @bus_method(needs=Right.RUN, what="take a file")
        async def Take(self, call: Call, name: Annotated[str, DBusSignature("s")],
                       fd: Annotated[int, DBusSignature("h")]) -> None:
            raise AssertionError("the body ran")

    # What dbus-fast calls: bus_method's guard (under dbus-fast's own wrapper).
    guard = Service.Take
    while not asyncio.iscoroutinefunction(guard):
        guard = guard.__wrapped__  # type: ignore[attr-defined]
    with pytest.raises(DBusError, match="cannot tell who is calling"):
        asyncio.run(guard(Service(), "x", 42))
    assert discarded == [42]
