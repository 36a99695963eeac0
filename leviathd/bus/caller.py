"""Who is calling: the unique bus name of the sender, captured around dispatch,
resolved to a uid and pid by the bus daemon. Never from the message body.

dbus-fast does not hand the message to service methods. A message handler runs
for every incoming message before dispatch and sets a context variable; the
task that runs an async method is created right after, in the same context, so
the method reads its own sender."""

from __future__ import annotations

import asyncio
import contextvars

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from leviathd.authority import Caller
from leviathd.errors import AccessDenied

__all__ = ["Caller", "current", "install", "resolved", "sender"]

_sender: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "leviath_bus_sender", default=None
)
# The caller once resolved within a call (the method decorator asks first,
# the body again): one GetConnectionCredentials a call. A unique bus name
# stays one connection, one uid, for its whole life.
_resolved: contextvars.ContextVar[Caller | None] = contextvars.ContextVar(
    "leviath_bus_caller", default=None
)


# What the bus said of a unique name, kept per bus connection: a unique name
# is one connection for the life of that bus (never reused on it), so its
# uid and pid stay true (another bus, even one reached again at the same
# address, numbers its names afresh: hence the bus in the key). Calls are counted by uid before
# they run (bounds.PER_UID): a connection's calls after its first need no
# round trip to the bus to be counted. Cleared whole when full.
_KNOWN_MAX = 4096
_known: dict[tuple[MessageBus, str], Caller] = {}
# One question to the bus at a time per connection: its first calls, sent
# together, wait for the same answer.
_asking: dict[tuple[MessageBus, str], asyncio.Future[Caller]] = {}


def install(bus: MessageBus) -> None:
    def capture(msg: Message) -> bool:
        if msg.message_type is MessageType.METHOD_CALL:
            _sender.set(msg.sender)
        return False

    bus.add_message_handler(capture)


def sender() -> str:
    """The unique bus name of the message being served ("" outside a call)."""
    return _sender.get() or ""


def resolved() -> Caller | None:
    """The caller, if this call already asked the bus who it is."""
    known = _resolved.get()
    return known if known is not None and known.sender == _sender.get() else None


async def current(bus: MessageBus) -> Caller:
    sender = _sender.get()
    if not sender:
        raise AccessDenied("cannot tell who is calling")
    known = _resolved.get()
    if known is not None and known.sender == sender:
        return known
    key = (bus, sender)
    kept = _known.get(key)
    if kept is None:
        asking = _asking.get(key)
        if asking is None:
            asking = _asking[key] = asyncio.ensure_future(_ask(bus, sender))
            asking.add_done_callback(lambda _done: _asking.pop(key, None))
        # Shielded: one call given up (its caller gone) ends no other's wait.
        kept = await asyncio.shield(asking)
    _resolved.set(kept)
    return kept


async def _ask(bus: MessageBus, sender: str) -> Caller:
    reply = await bus.call(
        Message(
            destination="org.freedesktop.DBus",
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
            member="GetConnectionCredentials",
            signature="s",
            body=[sender],
        )
    )
    if reply is None or reply.message_type is MessageType.ERROR:
        raise AccessDenied("the bus could not say who is calling")
    creds = reply.body[0]
    if "UnixUserID" not in creds:
        raise AccessDenied("the bus could not say who is calling")
    pid = creds["ProcessID"].value if "ProcessID" in creds else None
    who = Caller(sender=sender, uid=int(creds["UnixUserID"].value), pid=pid)
    if len(_known) >= _KNOWN_MAX:
        _known.clear()
    _known[(bus, sender)] = who
    return who
