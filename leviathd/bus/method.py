"""One decorator for every bus method, after firewalld's
`@dbus_polkit_require_auth` + `@dbus_handle_exceptions` and tuned's
`@exports.export`: it makes the function a D-Bus method, maps what goes wrong
to a named D-Bus error (errors.translated), and states the rights (polkit
actions, `polkit.ACTIONS`) the method involves:

- `needs`: the right the caller must hold before the body runs at all
  (asked here, at the edge; the body never sees a caller without it);
- `asks`: rights the service asks for itself, through the call's
  `Authority`, only when the request needs them (Run asks for
  run-unsandboxed only for an unsandboxed run; Stop asks for manage-any only
  for another user's agent), so that no right is put to polkit, or to the
  person, that a call does not need.

The method is handed a `Call` as its first argument after self (D-Bus never
sees it): its caller, from the bus, and an `Authority` limited to `needs`
and `asks`. Asking for any other right raises `UndeclaredRight`, so the
declaration is what the method can ask, not a label beside it. A service
built before any call (`Agents`) is given `ServedAuthority`, which is the
limited Authority of whichever call is being served.

tests/unit/test_bus_methods.py holds every method of the interfaces to a
declaration, and the declared rights to the polkit policy file."""

from __future__ import annotations

import contextvars
import functools
import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from dbus_fast.aio import MessageBus

from leviathd import fdclose
from leviathd.authority import Authority, Call, Caller, Limited, Right, UndeclaredRight
from leviathd.bus import caller, outside, polkit
from leviathd.bus.compat import DBusSignature, dbus_method
from leviathd.bus.errors import translated

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

DECLARATION = "__leviath_polkit__"


@dataclass(frozen=True)
class Declared:
    needs: Right | None
    asks: tuple[Right, ...]

    @property
    def rights(self) -> frozenset[Right]:
        return frozenset((*([self.needs] if self.needs else []), *self.asks))

    @property
    def actions(self) -> frozenset[str]:
        """The polkit actions of the declared rights."""
        return frozenset(polkit.ACTIONS[r] for r in self.rights)


class OnBus(Protocol):
    _bus: MessageBus


# The limited Authority of the call being served (each call runs in a task of
# its own, so in a context of its own; tasks it starts inherit it).
_served: contextvars.ContextVar[Authority | None] = contextvars.ContextVar(
    "leviath_served_authority", default=None
)


def _serving() -> Authority:
    authority = _served.get()
    if authority is None:
        raise UndeclaredRight("a right was asked outside any bus method")
    return authority


class ServedAuthority:
    """The Authority of the bus call being served: the services built once
    (Agents) ask through it, and get exactly the calling method's limits."""

    async def allowed(self, who: Caller, right: Right) -> bool:
        return await _serving().allowed(who, right)

    async def require(self, who: Caller, right: Right, what: str) -> None:
        await _serving().require(who, right, what)


def _without_call(fn: Callable[..., Any]) -> inspect.Signature:
    """fn's signature as D-Bus sees it: without the `call` it is handed."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if len(params) < 2 or params[1].name != "call":
        raise TypeError(f"{fn.__name__}: a bus method takes (self, call: Call, ...)")
    return sig.replace(parameters=[params[0], *params[2:]])


def _descriptor_positions(fn: Callable[..., Any]) -> tuple[int, ...]:
    """Where in the D-Bus arguments fn takes descriptors (signature h)."""
    hints = typing.get_type_hints(fn, include_extras=True)
    names = list(inspect.signature(fn).parameters)[2:]
    return tuple(i for i, name in enumerate(names)
                 if any(isinstance(m, DBusSignature) and m.signature == "h"
                        for m in getattr(hints.get(name), "__metadata__", ())))


def bus_method(
    *, needs: Right | None = None, what: str = "", asks: tuple[Right, ...] = (),
    name: str | None = None, control: str = "",
) -> Callable[[F], F]:
    if needs is not None and not what:
        raise ValueError("a method that needs a right says what it does (for the refusal)")
    declared = Declared(needs, asks)

    def deco(fn: F) -> F:
        descriptors = _descriptor_positions(fn)

        @functools.wraps(fn)
        async def guarded(self: OnBus, *args: Any) -> Any:
            try:
                who = await caller.current(self._bus)
                if control:
                    await outside.require_outside(self._bus, who.sender, control)
                authority = Limited(polkit.PolkitAuthority(self._bus), who, declared.rights)
                if needs is not None:
                    await authority.require(who, needs, what)
            except BaseException:
                # Descriptors a call carries are its method's to close (bus/
                # fds.py); refused before the body, they are closed here.
                for i in descriptors:
                    if i < len(args) and isinstance(args[i], int) and args[i] >= 0:
                        fdclose.discard(args[i])
                raise
            token = _served.set(authority)
            try:
                return await fn(self, Call(who, authority), *args)
            finally:
                _served.reset(token)

        guarded.__signature__ = _without_call(fn)  # type: ignore[attr-defined]
        setattr(guarded, DECLARATION, declared)
        return cast(F, dbus_method(name)(translated(guarded)))

    return deco
