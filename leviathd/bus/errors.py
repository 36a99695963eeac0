"""Turn what goes wrong inside a method into a named D-Bus error a person can
read; never a traceback on the bus."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from dbus_fast.errors import DBusError

from leviathd.bus import bounds, caller
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
        try:
            bounds.IN_FLIGHT.enter(sender)
        except LeviathError as exc:
            raise DBusError(exc.dbus_name, str(exc)) from None
        try:
            return await fn(*args, **kwargs)
        except DBusError:
            raise
        except LeviathError as exc:
            text = str(exc)
            log.info("%s refused: %s", fn.__name__, bounds.excerpt(text, LOG_LIMIT))
            if len(text) > REPLY_LIMIT:
                text = text[:REPLY_LIMIT] + " [...]"
            raise DBusError(exc.dbus_name, text) from None
        except Exception:
            log.exception("%s failed", fn.__name__)
            raise DBusError(
                "org.leviath.Error.Failed",
                "internal error in leviathd; see `journalctl -u leviathd -p err`",
            ) from None
        finally:
            bounds.IN_FLIGHT.leave(sender)

    return wrapper
