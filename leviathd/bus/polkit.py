"""Ask polkit whether a bus caller may do something. The subject is the
caller's bus name, so polkit, not this daemon, decides who that is."""

from __future__ import annotations

import asyncio
import logging

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from leviathd.authority import Caller, Right
from leviathd.bus import names
from leviathd.bus.calllog import CALLS
from leviathd.errors import AccessDenied, LeviathError

log = logging.getLogger(__name__)

AUTHORITY = "org.freedesktop.PolicyKit1"
AUTHORITY_PATH = "/org/freedesktop/PolicyKit1/Authority"
AUTHORITY_IFACE = "org.freedesktop.PolicyKit1.Authority"
# Errors that mean "no polkit here", after which only root is allowed.
_ABSENT = {
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    "org.freedesktop.DBus.Error.Spawn.ChildExited",
    "org.freedesktop.DBus.Error.Spawn.ServiceNotFound",
}
# Errors that mean "polkit did not answer this time": under load the bus
# refuses more pending replies (LimitsExceeded), and a polkit restart drops
# the calls in flight (NoReply). Asked once more; then the caller is refused
# with the truth, not "not authorized".
_TRANSIENT = {
    "org.freedesktop.DBus.Error.LimitsExceeded",
    "org.freedesktop.DBus.Error.NoReply",
    "org.freedesktop.DBus.Error.TimedOut",
    "org.freedesktop.DBus.Error.Disconnected",
}
RETRY_DELAY = 0.25


class AuthorizationUnavailable(LeviathError):
    dbus_name = "org.leviath.Error.AuthorizationUnavailable"


async def _check(bus: MessageBus, caller: Caller, action: str, interactive: bool) -> Message:
    subject = ("system-bus-name", {"name": Variant("s", caller.sender)})
    reply = await bus.call(
        Message(
            destination=AUTHORITY,
            path=AUTHORITY_PATH,
            interface=AUTHORITY_IFACE,
            member="CheckAuthorization",
            signature="(sa{sv})sa{ss}us",
            body=[subject, action, {}, 1 if interactive else 0, ""],
        )
    )
    if reply is None:
        raise AuthorizationUnavailable("polkit did not answer; try again")
    return reply


async def is_authorized(
    bus: MessageBus, caller: Caller, action: str, *, interactive: bool = False
) -> bool:
    """Fails closed: False when polkit says no or is absent; raises
    AuthorizationUnavailable when it did not answer (twice)."""
    if caller.is_root:
        return True
    reply = await _check(bus, caller, action, interactive)
    if reply.message_type is MessageType.ERROR and reply.error_name in _TRANSIENT:
        CALLS.line(log, caller.uid, logging.WARNING,
                   "polkit did not answer (%s); asking once more", reply.error_name)
        await asyncio.sleep(RETRY_DELAY)
        reply = await _check(bus, caller, action, interactive)
        if reply.message_type is MessageType.ERROR and reply.error_name in _TRANSIENT:
            CALLS.line(log, caller.uid, logging.ERROR,
                       "polkit did not answer twice (%s): refusing", reply.error_name)
            raise AuthorizationUnavailable(
                f"polkit did not answer ({reply.error_name}); try again"
            )
    if reply.message_type is MessageType.ERROR:
        if reply.error_name in _ABSENT:
            CALLS.line(log, caller.uid, logging.WARNING,
                       "polkit is not reachable (%s): only root is allowed", reply.error_name)
        else:
            CALLS.line(log, caller.uid, logging.WARNING, "polkit refused to answer %s: %s",
                       action, reply.error_name)
        return False
    authorized, _challenge, _details = reply.body[0]
    return bool(authorized)


async def require(bus: MessageBus, caller: Caller, action: str, what: str) -> None:
    if not await is_authorized(bus, caller, action):
        raise AccessDenied(f"not authorized to {what} (polkit action {action})")


# The polkit action of each right (tests/unit/test_bus_methods.py holds
# them to polkit/org.leviath.policy).
ACTIONS: dict[Right, str] = {
    Right.RUN: names.ACTION_RUN,
    Right.RUN_UNSANDBOXED: names.ACTION_RUN_UNSANDBOXED,
    Right.MANAGE_ANY: names.ACTION_MANAGE_ANY,
    Right.CONFIG_MANAGE: names.ACTION_CONFIG_MANAGE,
    Right.ANSWER_ANY: names.ACTION_ANSWER_ANY,
}


class PolkitAuthority:
    """The services' `Authority`, answered by polkit over this bus: each right
    is asked for only when a service needs it. Handed to a method only
    wrapped in `authority.Limited` (bus/method.py)."""

    def __init__(self, bus: MessageBus) -> None:
        self._bus = bus

    async def allowed(self, who: Caller, right: Right) -> bool:
        return await is_authorized(self._bus, who, ACTIONS[right])

    async def require(self, who: Caller, right: Right, what: str) -> None:
        await require(self._bus, who, ACTIONS[right], what)
