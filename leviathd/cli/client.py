"""The CLI's side of the bus: one connection to the system bus, calls to
org.leviath.Manager1, and D-Bus errors turned into one readable line."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus

from leviathd.bus.names import BUS_NAME, MANAGER_IFACE, OBJECT_PATH
from leviathd.cli.wire import DRIVER as _DRIVER
from leviathd.cli.wire import RESTART_MATCH, new_owner
from leviathd.errors import LeviathError

_FRIENDLY = {
    "org.freedesktop.DBus.Error.ServiceUnknown": (
        "leviathd is not running (start it with `systemctl start leviathd`)"
    ),
    "org.freedesktop.DBus.Error.NameHasNoOwner": "leviathd is not running",
    "org.freedesktop.DBus.Error.AccessDenied": "the system bus refused the call",
}


class DaemonError(LeviathError):
    def __init__(self, name: str, text: str) -> None:
        super().__init__(text)
        self.name = name


class Client:
    def __init__(self, bus: MessageBus) -> None:
        self.bus = bus
        self._daemon: str | None = None

    @classmethod
    async def connect(cls) -> Client:
        try:
            bus = await MessageBus(bus_type=BusType.SYSTEM, negotiate_unix_fd=True).connect()
        except (OSError, ValueError) as exc:
            raise LeviathError(f"cannot reach the system bus: {exc}") from None
        return cls(bus)

    async def call(
        self, member: str, signature: str = "", body: list[Any] | None = None,
        unix_fds: list[int] | None = None, *, interface: str = MANAGER_IFACE,
    ) -> list[Any]:
        body, _fds = await self.call_with_fds(
            member, signature, body, unix_fds, interface=interface
        )
        return body

    async def call_with_fds(
        self, member: str, signature: str = "", body: list[Any] | None = None,
        unix_fds: list[int] | None = None, *, interface: str = MANAGER_IFACE,
    ) -> tuple[list[Any], list[int]]:
        """The reply's body and the descriptors it carries (a 'h' in the body
        is an index into them)."""
        reply = await self.bus.call(
            Message(
                destination=BUS_NAME, path=OBJECT_PATH, interface=interface,
                member=member, signature=signature, body=body or [], unix_fds=unix_fds or [],
            )
        )
        assert reply is not None
        if reply.message_type is MessageType.ERROR:
            text = str(reply.body[0]) if reply.body else ""
            name = reply.error_name or "org.leviath.Error.Failed"
            raise DaemonError(name, _FRIENDLY.get(name, text or name))
        return list(reply.body), list(reply.unix_fds)

    async def daemon_name(self) -> str:
        """The daemon's unique bus name (":1.42"). Signals are trusted only
        from it: any local user can send a signal straight to this connection
        (unicast) with any path, interface and body; only the sender is
        stamped by the bus, and it is always a unique name."""
        if self._daemon is None:
            reply = await self._driver("GetNameOwner", "s", [BUS_NAME])
            if reply.message_type is MessageType.ERROR:
                # Not running yet: a method call would have activated it, so
                # activate it here too (D-Bus activation through systemd).
                await self._driver("StartServiceByName", "su", [BUS_NAME, 0])
                reply = await self._driver("GetNameOwner", "s", [BUS_NAME])
            if reply.message_type is MessageType.ERROR:
                raise DaemonError(
                    "org.freedesktop.DBus.Error.NameHasNoOwner",
                    _FRIENDLY["org.freedesktop.DBus.Error.ServiceUnknown"],
                )
            self._daemon = str(reply.body[0])
        return self._daemon

    async def _driver(self, member: str, signature: str, body: list[Any]) -> Message:
        reply = await self.bus.call(
            Message(
                destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                interface="org.freedesktop.DBus", member=member, signature=signature,
                body=body,
            )
        )
        assert reply is not None
        return reply

    def from_daemon(self, msg: Message, member: str, interface: str = MANAGER_IFACE) -> bool:
        """`msg` is the signal `member` that the daemon itself emitted: its
        unique name, its object path and interface (see daemon_name)."""
        return (
            msg.message_type is MessageType.SIGNAL
            and self._daemon is not None
            and msg.sender == self._daemon
            and msg.path == OBJECT_PATH
            and msg.interface == interface
            and msg.member == member
        )

    def new_daemon(self, msg: Message) -> bool:
        """msg is the bus saying a daemon now owns the name (after
        watch_restarts): signals are trusted from it from now on."""
        owner = new_owner(msg.message_type is MessageType.SIGNAL, msg.sender, msg.interface,
                          msg.member, list(msg.body))
        if owner is None:
            return False
        self._daemon = owner
        return True

    async def watch_restarts(self) -> None:
        """Ask the bus to say when the daemon's name changes hands (a restart):
        the new daemon has a new unique name and does not know us."""
        await self.daemon_name()
        await self.bus.call(
            Message(
                destination=_DRIVER, path="/org/freedesktop/DBus", interface=_DRIVER,
                member="AddMatch", signature="s",
                body=[RESTART_MATCH],
            )
        )

    async def add_signal_match(self, member: str, interface: str = MANAGER_IFACE) -> None:
        """Ask the bus for the daemon's `member` signals. This only filters
        broadcasts; unicast signals reach us whatever the rules, so handlers
        must still check each message with from_daemon."""
        sender = await self.daemon_name()
        await self.bus.call(
            Message(
                destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                interface="org.freedesktop.DBus", member="AddMatch", signature="s",
                body=[f"type='signal',sender='{sender}',path='{OBJECT_PATH}',"
                      f"interface='{interface}',member='{member}'"],
            )
        )

    async def drain(self, fd: int, sink: Callable[[bytes], None]) -> None:
        """Read a pipe the daemon handed us to its end, giving each chunk to
        `sink`, while this connection stays open: the daemon ends the
        process behind the pipe when the connection goes (Logs, Audit)."""
        os.set_blocking(fd, False)
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[bytes] = asyncio.Queue()

        def readable() -> None:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(fd)
            chunks.put_nowait(data)

        loop.add_reader(fd, readable)
        try:
            while chunk := await chunks.get():
                sink(chunk)
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    def close(self) -> None:
        self.bus.disconnect()
