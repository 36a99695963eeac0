"""One decorator for every bus method, after firewalld's
`@dbus_polkit_require_auth` + `@dbus_handle_exceptions` and tuned's
`@exports.export`: it makes the function a D-Bus method, maps what goes wrong
to a named D-Bus error (errors.translated), and states the polkit actions the
method involves:

- `needs`: the action the caller must hold before the body runs at all
  (asked here, at the edge; the body never sees a caller without it);
- `asks`: actions the service asks for itself, through its `Authority`, only
  when the request needs them (Run asks for run-unsandboxed only for an
  unsandboxed run; Stop asks for manage-any only for another user's agent),
  so that no right is put to polkit, or to the person, that a call does not
  need.

tests/unit/test_bus_methods.py holds every method of the interfaces to a
declaration, and the declared actions to the polkit policy file."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from dbus_fast.aio import MessageBus

from leviathd.bus import caller, polkit
from leviathd.bus.compat import dbus_method
from leviathd.bus.errors import translated

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

DECLARATION = "__leviath_polkit__"


@dataclass(frozen=True)
class Declared:
    needs: str | None
    asks: tuple[str, ...]


class OnBus(Protocol):
    _bus: MessageBus


def bus_method(
    *, needs: str | None = None, what: str = "", asks: tuple[str, ...] = (),
    name: str | None = None,
) -> Callable[[F], F]:
    if needs is not None and not what:
        raise ValueError("a method that needs an action says what it does (for the refusal)")

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        async def guarded(self: OnBus, *args: Any, **kwargs: Any) -> Any:
            if needs is not None:
                who = await caller.current(self._bus)
                await polkit.require(self._bus, who, needs, what)
            return await fn(self, *args, **kwargs)

        setattr(guarded, DECLARATION, Declared(needs, asks))
        return cast(F, dbus_method(name)(translated(guarded)))

    return deco
