"""The CLI's side of the bus: one connection to the system bus, calls to
org.leviath.Manager1, and D-Bus errors turned into one readable line."""

from __future__ import annotations

from typing import Any

from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus

from leviathd.bus.names import BUS_NAME, MANAGER_IFACE, OBJECT_PATH
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

    async def add_signal_match(self, member: str, interface: str = MANAGER_IFACE) -> None:
        await self.bus.call(
            Message(
                destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                interface="org.freedesktop.DBus", member="AddMatch", signature="s",
                body=[f"type='signal',sender='{BUS_NAME}',interface='{interface}',"
                      f"member='{member}'"],
            )
        )

    def close(self) -> None:
        self.bus.disconnect()
