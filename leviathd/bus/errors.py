"""Turn what goes wrong inside a method into a named D-Bus error a person can
read; never a traceback on the bus."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from dbus_fast.aio import MessageBus
from dbus_fast.errors import DBusError

from leviathd.bus import bounds, caller, pacing
from leviathd.bus.calllog import CALLS
from leviathd.errors import LeviathError

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


# A reply or log line is ours to bound: messages can carry paths, rule targets
# or command lines that came from a client.
REPLY_LIMIT = 2000
LOG_LIMIT = 300


def translated(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        sender = caller.sender()
        # Calls are counted by uid too (bounds.PER_UID), so the uid is asked
        # first, holding no place: a connection's first calls held theirs
        # while the bus answered, and carol's connections coming and going
        # (32 calls each) still filled the total (test_redteam_bus2.py).
        who = await _uid(args)
        try:
            bounds.IN_FLIGHT.enter(sender)
        except LeviathError as exc:
            raise DBusError(exc.dbus_name, str(exc)) from None
        try:
            try:
                bounds.IN_FLIGHT.enter_uid(who)
            except LeviathError as exc:
                raise DBusError(exc.dbus_name, str(exc)) from None
            try:
                # Counted in flight while it waits: a uid's waiting calls
                # stay within its caps (bounds.PER_UID).
                await pacing.turn(who)
                return await fn(*args, **kwargs)
            finally:
                bounds.IN_FLIGHT.leave_uid(who)
        except DBusError:
            raise
        except LeviathError as exc:
            text = str(exc)
            uid = await _uid(args)
            CALLS.line(log, uid, logging.INFO, "%s refused (uid %s): %s",
                       fn.__name__, _shown(uid), bounds.excerpt(text, LOG_LIMIT))
            if len(text) > REPLY_LIMIT:
                text = text[:REPLY_LIMIT] + " [...]"
            raise DBusError(exc.dbus_name, text) from None
        except Exception as exc:
            uid = await _uid(args)
            CALLS.line(log, uid, logging.ERROR, "%s failed (uid %s)", fn.__name__, _shown(uid),
                       exc_info=exc)
            raise DBusError(
                "org.leviath.Error.Failed",
                "internal error in leviathd; see `journalctl -u leviathd -p err`",
            ) from None
        finally:
            bounds.IN_FLIGHT.leave(sender)

    return wrapper


async def _uid(args: tuple[object, ...]) -> int | None:
    """Whose call this was, for the per-uid log budget: known if the method
    asked already; else asked now (a call refused on its arguments alone),
    best effort: a caller that has gone is logged under None."""
    known = caller.resolved()
    if known is not None:
        return known.uid
    bus = getattr(args[0], "_bus", None) if args else None
    if not isinstance(bus, MessageBus):
        return None
    try:
        return (await caller.current(bus)).uid
    except Exception:
        return None


def _shown(uid: int | None) -> str:
    return "unknown" if uid is None else str(uid)
