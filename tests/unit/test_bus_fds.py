"""Descriptors a client attaches to a message (leviathd/bus/fds.py), against
a real dbus-daemon, from a hostile client's side: descriptors on calls and
signals that take none, on a call that looks like RunAttached in all but one
respect, indices that name no descriptor, one descriptor named thrice. The
client sees what the daemon kept by its pipe's end: a pipe whose write end
the daemon still holds never reads EOF."""

from __future__ import annotations

import array
import asyncio
import os
import resource
import socket
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus
from dbus_fast.aio.message_reader import build_message_reader
from dbus_fast.service import ServiceInterface
from session_bus import bus_address

from leviathd import fdclose
from leviathd.bus import fds
from leviathd.bus.compat import DBusSignature, dbus_method, many_fds, roomy
from leviathd.bus.names import MANAGER_IFACE, OBJECT_PATH

__all__ = ["bus_address"]

Fd = Annotated[int, DBusSignature("h")]
VarDict = Annotated[dict[str, Variant], DBusSignature("a{sv}")]
Str = Annotated[str, DBusSignature("s")]
RUN_SIG = "a{sv}hhh"


class Manager(ServiceInterface):
    """RunAttached's shape; like the daemon's handler, it writes to and closes
    each descriptor it is given once, and keeps what it was handed."""

    def __init__(self) -> None:
        super().__init__(MANAGER_IFACE)
        self.given: list[tuple[Any, ...]] = []

    @dbus_method()
    async def RunAttached(self, request: VarDict, a: Fd, b: Fd, c: Fd) -> Str:
        self.given.append((a, b, c))
        for n, fd in enumerate((a, b, c)):
            if isinstance(fd, int) and fd >= 0:
                os.write(fd, f"{n}".encode())
                os.close(fd)  # a second close of one number raises EBADF: an error reply
        return "ok"

    @dbus_method()
    async def Ping(self) -> Str:
        return "pong"


class Holder(ServiceInterface):
    """A service the daemon calls whose reply carries a descriptor."""

    def __init__(self, fd: int) -> None:
        super().__init__("org.leviath.test.Holder")
        self.fd = fd

    @dbus_method()
    async def Give(self) -> Fd:
        return self.fd


@pytest.fixture
def pipes() -> Iterator[list[tuple[int, int]]]:
    made: list[tuple[int, int]] = []
    yield made
    for pair in made:
        for fd in pair:
            try:
                os.close(fd)
            except OSError:
                pass


def _pipes(made: list[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    for _ in range(n):
        r, w = os.pipe()
        os.set_blocking(r, False)
        made.append((r, w))
    return made[-n:]


def _written(r: int) -> bytes:
    try:
        return os.read(r, 100)
    except BlockingIOError:
        return b""


def _held_elsewhere(made: list[tuple[int, int]]) -> list[int]:
    """Closes the client's own write ends; the pipes (by index) whose write
    end is still open somewhere, i.e. in the daemon. The daemon closes
    them in its closer thread (fdclose.py), which is waited for first."""
    assert fdclose.wait_closed()
    held = []
    for k, (r, w) in enumerate(made):
        try:
            os.close(w)
        except OSError:
            pass
        made[k] = (r, -1)
        try:
            while os.read(r, 4096):
                pass
        except BlockingIOError:
            held.append(k)
    return held


async def _pair(address: str) -> tuple[MessageBus, MessageBus, Manager]:
    server = await many_fds(MessageBus(bus_address=address, negotiate_unix_fd=True)).connect()
    manager = Manager()
    server.export(OBJECT_PATH, manager)
    client = await MessageBus(bus_address=address, negotiate_unix_fd=True).connect()
    return server, client, manager


async def _ping(client: MessageBus, server: MessageBus) -> None:
    # The bus keeps one connection's messages in order: once this is answered,
    # all the client sent before has been through the daemon's handlers.
    reply = await client.call(Message(destination=server.unique_name, path=OBJECT_PATH,
                                      interface=MANAGER_IFACE, member="Ping"))
    assert reply is not None and reply.body == ["pong"], reply


def _request() -> dict[str, Variant]:
    return {"word": Variant("s", "w")}


# Each differs from a RunAttached call in one respect only.
LOOKALIKES: dict[str, dict[str, Any]] = {
    "signal": dict(message_type=MessageType.SIGNAL),
    "other interface": dict(interface="org.leviath.Other1"),
    "other path": dict(path="/org/leviath/Other"),
    "other member": dict(member="RunDetached"),
    "other signature": dict(signature="a{sv}hhhs"),
}


@pytest.mark.parametrize("kind", sorted(LOOKALIKES))
def test_descriptors_on_a_message_that_is_not_run_attached_are_closed_at_once(
    bus_address: str, pipes: list[tuple[int, int]], kind: str
) -> None:
    sent = _pipes(pipes, 3)

    async def go() -> list[tuple[Any, ...]]:
        server, client, manager = await _pair(bus_address)
        fields: dict[str, Any] = dict(
            destination=server.unique_name, path=OBJECT_PATH, interface=MANAGER_IFACE,
            member="RunAttached", signature=RUN_SIG, body=[_request(), 0, 1, 2],
            unix_fds=[w for _, w in sent],
        )
        fields.update(LOOKALIKES[kind])
        if fields["signature"] != RUN_SIG:
            fields["body"] = [*fields["body"], "x"]
        msg = Message(**fields)
        if msg.message_type is MessageType.SIGNAL:
            await client.send(msg)
        else:
            reply = await client.call(msg)
            assert reply is not None and reply.message_type is MessageType.ERROR, reply
        await _ping(client, server)
        client.disconnect()
        server.disconnect()
        return manager.given

    assert asyncio.run(go()) == []
    assert _held_elsewhere(pipes) == []


def test_descriptors_on_a_call_that_takes_none_are_closed_at_once(
    bus_address: str, pipes: list[tuple[int, int]]
) -> None:
    sent = _pipes(pipes, 16)

    async def go() -> None:
        server, client, _ = await _pair(bus_address)
        reply = await client.call(Message(
            destination=server.unique_name, path=OBJECT_PATH, interface=MANAGER_IFACE,
            member="Ping", unix_fds=[w for _, w in sent]))
        assert reply is not None and reply.body == ["pong"], reply
        client.disconnect()
        server.disconnect()

    asyncio.run(go())
    assert _held_elsewhere(pipes) == []


@pytest.mark.parametrize("indices", [(0, 1, 3), (0, 1, 7), (3, 3, 3)])
def test_indices_naming_no_descriptor_leave_none_in_the_daemon(
    bus_address: str, pipes: list[tuple[int, int]], indices: tuple[int, int, int]
) -> None:
    """Three sent, an index past them: nothing is kept, and the handler is
    handed no number that may since name another of the daemon's files."""
    sent = _pipes(pipes, 3)

    async def go() -> list[tuple[Any, ...]]:
        server, client, manager = await _pair(bus_address)
        await client.call(Message(
            destination=server.unique_name, path=OBJECT_PATH, interface=MANAGER_IFACE,
            member="RunAttached", signature=RUN_SIG, body=[_request(), *indices],
            unix_fds=[w for _, w in sent]))
        await _ping(client, server)
        client.disconnect()
        server.disconnect()
        return manager.given

    given = asyncio.run(go())
    assert all(fd is None or fd == -1 for call in given for fd in call), given
    assert _held_elsewhere(pipes) == []


@pytest.mark.parametrize("indices", [(0, 0, 0), (1, 0, 1), (0, 1, 1), (1, 1, 0)])
def test_a_descriptor_named_twice_is_a_copy_each_closed_once(
    bus_address: str, pipes: list[tuple[int, int]], indices: tuple[int, int, int]
) -> None:
    """One number handed to two arguments would be closed twice, the second
    time perhaps another thread's new file; and the one no argument names
    any more must not stay behind."""
    sent = _pipes(pipes, 2)

    async def go() -> tuple[Message, list[tuple[Any, ...]]]:
        server, client, manager = await _pair(bus_address)
        reply = await client.call(Message(
            destination=server.unique_name, path=OBJECT_PATH, interface=MANAGER_IFACE,
            member="RunAttached", signature=RUN_SIG, body=[_request(), *indices],
            unix_fds=[w for _, w in sent]))
        assert reply is not None
        client.disconnect()
        server.disconnect()
        return reply, manager.given

    reply, given = asyncio.run(go())
    assert reply.message_type is MessageType.METHOD_RETURN, reply.body
    ((a, b, c),) = given
    assert len({a, b, c}) == 3, given
    got = [_written(r) for r, _ in sent]
    want = [b"".join(str(n).encode() for n, i in enumerate(indices) if i == k) for k in (0, 1)]
    assert got == want
    assert _held_elsewhere(pipes) == []


def test_when_no_copy_can_be_made_the_argument_names_no_descriptor(
    bus_address: str, pipes: list[tuple[int, int]]
) -> None:
    """The daemon out of descriptors as a call naming one three times arrives:
    the copies it cannot make are -1, never a number it holds (0, its stdin)."""
    ((r, w),) = _pipes(pipes, 1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    filler: list[int] = []

    async def go() -> list[tuple[Any, ...]]:
        server, client, manager = await _pair(bus_address)
        top = max(int(n) for n in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (top + 64, hard))
        try:
            while True:
                filler.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            pass
        os.close(filler.pop())  # room for the one descriptor sent, no more
        try:
            await client.call(Message(
                destination=server.unique_name, path=OBJECT_PATH, interface=MANAGER_IFACE,
                member="RunAttached", signature=RUN_SIG, body=[_request(), 0, 0, 0],
                unix_fds=[w]))
        finally:
            for fd in filler:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        client.disconnect()
        server.disconnect()
        return manager.given

    given = asyncio.run(go())
    assert len(given) == 1 and given[0][1:] == (-1, -1), given
    assert given[0][0] >= 3, given
    assert os.read(r, 100) == b"0"
    os.fstat(0)  # the daemon's own descriptors are still its own
    assert _held_elsewhere(pipes) == []


def test_run_attached_keeps_its_three_and_closes_the_rest(
    bus_address: str, pipes: list[tuple[int, int]]
) -> None:
    sent = _pipes(pipes, 6)

    async def go() -> Message:
        server, client, _ = await _pair(bus_address)
        reply = await client.call(Message(
            destination=server.unique_name, path=OBJECT_PATH, interface=MANAGER_IFACE,
            member="RunAttached", signature=RUN_SIG, body=[_request(), 4, 1, 2],
            unix_fds=[w for _, w in sent]))
        assert reply is not None
        client.disconnect()
        server.disconnect()
        return reply

    assert asyncio.run(go()).body == ["ok"]
    assert [os.read(sent[k][0], 10) for k in (4, 1, 2)] == [b"0", b"1", b"2"]
    assert _held_elsewhere(pipes) == []


def test_a_reply_to_the_daemons_own_call_keeps_its_descriptor(
    bus_address: str, pipes: list[tuple[int, int]]
) -> None:
    """The bus lets only the callee answer a call: what its reply carries is
    the daemon's (as logind's Inhibit answers with a descriptor), not closed."""
    ((r, w),) = _pipes(pipes, 1)

    async def go() -> None:
        server, client, _ = await _pair(bus_address)
        client.export("/holder", Holder(w))
        reply = await server.call(Message(
            destination=client.unique_name, path="/holder",
            interface="org.leviath.test.Holder", member="Give"))
        assert reply is not None and reply.message_type is MessageType.METHOD_RETURN, reply
        (fd,) = reply.unix_fds
        os.write(fd, b"kept")
        os.close(fd)
        client.disconnect()
        server.disconnect()

    asyncio.run(go())
    assert os.read(r, 100) == b"kept"


def test_a_reply_read_before_another_clients_call_keeps_none_of_its_descriptors(
    pipes: list[tuple[int, int]]
) -> None:
    """dbus-fast's own reader reads, in one pass, the bus's answer to a call
    of the daemon's (no descriptor: GetConnectionCredentials without a
    ProcessFD, bus/outside.py) and then another client's RunAttached with
    three. The coroutine awaiting the answer runs only after that pass: the
    answer must not show it the other client's descriptors (it closed them,
    and their handler closed the same numbers again: the daemon's own files
    by then). The messages go through a socket pair as the bus would send
    them; the reader and the handler are the daemon's."""
    sent = _pipes(pipes, 3)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        answer = Message(
            message_type=MessageType.METHOD_RETURN, reply_serial=7, serial=9,
            sender="org.freedesktop.DBus", destination=":1.1", signature="a{sv}",
            body=[{"ProcessID": Variant("u", 42)}])
        call = Message(
            destination=":1.1", path=OBJECT_PATH, interface=MANAGER_IFACE,
            member="RunAttached", signature=RUN_SIG, body=[_request(), 0, 1, 2], serial=3,
            sender=":1.9", unix_fds=[w for _, w in sent])
        theirs.sendall(answer._marshall(True))
        theirs.sendmsg([bytes(call._marshall(True))], [(
            socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [w for _, w in sent]))])
        ours.setblocking(False)
        roomy(ours)  # as the daemon's bus socket is (bus/compat.py many_fds)
        got: list[Message] = []

        def process(msg: Message) -> None:
            fds.owned_only(msg)  # the daemon's first handler (bus/compat.py many_fds)
            got.append(msg)

        build_message_reader(ours, process, lambda _exc: None, True)()
    assert [m.message_type for m in got] == [MessageType.METHOD_RETURN, MessageType.METHOD_CALL]
    run_fds = list(got[1].unix_fds)
    for fd in run_fds:
        os.close(fd)
    assert len(run_fds) == 3
    assert got[0].unix_fds == []
