"""dbus-fast's service decorators, made to read the same annotations in every
dbus-fast release the package supports.

dbus-fast 4 added `Annotated[T, DBusSignature("s")]` (module
`dbus_fast.annotations`); dbus-fast 2.x, which Debian 13 ships (2.44), reads
only a bare signature string as the annotation, and that is not a type mypy
accepts. So the interfaces annotate with `Annotated[T, DBusSignature(...)]`
using the `DBusSignature` defined here, and these decorators replace each
function's annotations with the bare strings just before dbus-fast's own
decorator inspects it: the Python types stay for mypy, and every dbus-fast
version sees the plain strings it has always understood."""

import array
import inspect
import socket
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from dbus_fast import service
from dbus_fast.aio import MessageBus
from dbus_fast.constants import PropertyAccess

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class DBusSignature:
    signature: str


def _bare(hint: Any) -> str | None:
    """The signature in hint; None for `-> None` and for what dbus-fast does not
    read (a signal's arguments), which it then sees as unannotated."""
    for meta in getattr(hint, "__metadata__", ()):
        if isinstance(meta, DBusSignature):
            return meta.signature
    return None


def _plain(fn: F) -> F:
    """Rewrite the annotations of fn and of every function it wraps (inspect
    follows __wrapped__ down to the innermost one)."""
    hints = typing.get_type_hints(inspect.unwrap(fn), include_extras=True)
    bare: dict[str, str] = {}
    for name, hint in hints.items():
        sig = _bare(hint)
        if sig is not None:
            bare[name] = sig
    f: Any = fn
    while f is not None:
        f.__annotations__ = dict(bare)
        # A wrapper that shows D-Bus fewer arguments than it wraps
        # (bus/method.py hands its method a Call) says so in __signature__,
        # where inspect looks first: its annotations are made bare too.
        sig = vars(f).get("__signature__")
        if isinstance(sig, inspect.Signature):
            f.__signature__ = sig.replace(
                parameters=[p.replace(annotation=bare.get(p.name, p.empty))
                            for p in sig.parameters.values()],
                return_annotation=bare.get("return", sig.empty),
            )
        f = getattr(f, "__wrapped__", None)
    return fn


def dbus_method(name: str | None = None, disabled: bool = False) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        return cast(F, service.method(name=name, disabled=disabled)(_plain(fn)))

    return deco


def dbus_signal(name: str | None = None, disabled: bool = False) -> Callable[[F], F]:
    def deco(fn: F) -> F:
        return cast(F, service.signal(name=name, disabled=disabled)(_plain(fn)))

    return deco


def dbus_property(
    access: PropertyAccess = PropertyAccess.READWRITE,
    name: str | None = None,
    disabled: bool = False,
) -> Callable[[Callable[..., Any]], Any]:
    def deco(fn: Callable[..., Any]) -> Any:
        return service.dbus_property(access=access, name=name, disabled=disabled)(_plain(fn))

    return deco


class _ManyFdSocket(socket.socket):
    """dbus-fast before 2.45 reads each message with room for one descriptor
    (ancbufsize CMSG_LEN(4)); the kernel closes the rest, so RunAttached's
    stdin, stdout and stderr arrived as (fd, None, None) on Debian 13. Asking
    for room for 16, as later releases do, costs nothing where it is not needed."""

    __slots__ = ()

    def recvmsg(self, bufsize: int, ancbufsize: int = 0, flags: int = 0) -> Any:
        return super().recvmsg(bufsize, max(ancbufsize, _ROOM_FOR_FDS), flags)


_ROOM_FOR_FDS = socket.CMSG_LEN(16 * array.array("i").itemsize)


def roomy(sock: Any) -> None:
    """sock, read by dbus-fast's reader, gets room for 16 descriptors per
    message whatever the dbus-fast release."""
    if type(sock) is socket.socket:
        # The same object with a different class (same layout, no new slots):
        # dbus-fast keeps its references, nothing is duplicated or leaked.
        sock.__class__ = _ManyFdSocket


def many_fds(bus: MessageBus) -> MessageBus:
    """bus (constructed, not yet connected), able to receive several
    descriptors in one call whatever the dbus-fast release."""
    if bus._sock is not None:
        roomy(bus._sock)
    # What arrives is then closed unless a handler takes it (bus/fds.py).
    from leviathd.bus import fds

    bus.add_message_handler(fds.owned_only)
    return bus
