"""The bus side of `audit.readers.CallerWatch`: a caller has gone when the
bus driver says its unique name lost its owner (NameOwnerChanged)."""

from __future__ import annotations

from collections.abc import Callable

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

BUS_DRIVER = "org.freedesktop.DBus"


class BusCallerWatch:
    def __init__(self, bus: MessageBus) -> None:
        self._bus = bus
        self._handlers: list[Callable[[str], None]] = []
        self._installed = False

    def on_gone(self, handler: Callable[[str], None]) -> None:
        self._handlers.append(handler)

    async def watch(self, sender: str) -> None:
        if not self._installed:
            self._bus.add_message_handler(self._on_message)
            self._installed = True
        await self._driver("AddMatch", [_rule(sender)])

    async def unwatch(self, sender: str) -> None:
        await self._driver("RemoveMatch", [_rule(sender)])

    async def has_owner(self, sender: str) -> bool:
        reply = await self._driver("NameHasOwner", [sender])
        return bool(reply.body[0]) if reply.message_type is MessageType.METHOD_RETURN else False

    def _on_message(self, msg: Message) -> bool:
        if (msg.message_type is MessageType.SIGNAL and msg.sender == BUS_DRIVER
                and msg.interface == BUS_DRIVER and msg.member == "NameOwnerChanged"
                and msg.signature == "sss"):
            name, _old, new = msg.body
            if not new:
                for handler in self._handlers:
                    handler(name)
        return False

    async def _driver(self, member: str, body: list[str]) -> Message:
        reply = await self._bus.call(
            Message(destination=BUS_DRIVER, path="/org/freedesktop/DBus",
                    interface=BUS_DRIVER, member=member, signature="s", body=body)
        )
        assert reply is not None
        return reply


def _rule(sender: str) -> str:
    return (f"type='signal',sender='{BUS_DRIVER}',interface='{BUS_DRIVER}',"
            f"member='NameOwnerChanged',arg0='{sender}'")
