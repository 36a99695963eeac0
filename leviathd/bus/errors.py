"""Turn what goes wrong inside a method into a named D-Bus error a person can
read; never a traceback on the bus."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from dbus_fast.errors import DBusError

from leviathd.errors import LeviathError

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


def translated(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except DBusError:
            raise
        except LeviathError as exc:
            log.info("%s refused: %s", fn.__name__, exc)
            raise DBusError(exc.dbus_name, str(exc)) from None
        except Exception:
            log.exception("%s failed", fn.__name__)
            raise DBusError(
                "org.leviath.Error.Failed",
                "internal error in leviathd; see `journalctl -u leviathd`",
            ) from None

    return wrapper
