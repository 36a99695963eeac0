"""Who is calling and what they may do, as the services see it.

The bus edge learns the caller from the bus daemon and asks polkit; the
services only name the right they need and get a yes or no, so they depend on
no D-Bus module. The edge's implementation is
`leviathd.bus.polkit.PolkitAuthority`; it asks only when a service asks, so a
right that a call does not need is never put to polkit (or to the user).

Each bus method declares the rights it may ask for (`bus/method.py`), and is
handed a `Call`: its caller and an Authority `Limited` to those rights.
Asking for any other right, or about anyone but the caller, raises
`UndeclaredRight`: a programming error, never a refusal a client could
provoke, so the declaration is the whole of what a method can put to polkit."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


@dataclass(frozen=True)
class Caller:
    sender: str
    uid: int
    pid: int | None

    @property
    def is_root(self) -> bool:
        return self.uid == 0


class Right(StrEnum):
    RUN = "run"
    RUN_UNSANDBOXED = "run-unsandboxed"
    MANAGE_ANY = "manage-any"
    CONFIG_MANAGE = "config-manage"
    ANSWER_ANY = "answer-any"


class Authority(Protocol):
    async def allowed(self, who: Caller, right: Right) -> bool:
        """Fails closed: False when the answer is no or cannot be had."""
        ...

    async def require(self, who: Caller, right: Right, what: str) -> None:
        """Raises AccessDenied naming `what` unless `who` holds `right`."""
        ...


class UndeclaredRight(RuntimeError):
    """A method asked for a right it did not declare, or about someone other
    than its caller: a bug in the daemon (the client sees an internal error)."""


class Limited:
    """An Authority that answers only for `who` and only for `rights`; the
    question goes to `inner` (polkit) only once both hold."""

    def __init__(self, inner: Authority, who: Caller, rights: Iterable[Right]) -> None:
        self._inner = inner
        self._who = who
        self.rights = frozenset(rights)

    def _check(self, who: Caller, right: Right) -> None:
        if right not in self.rights:
            raise UndeclaredRight(
                f"right {right} asked but not declared (declared: "
                f"{', '.join(sorted(self.rights)) or 'none'})"
            )
        if who != self._who:
            raise UndeclaredRight(f"asked about uid {who.uid}, not the caller")

    async def allowed(self, who: Caller, right: Right) -> bool:
        self._check(who, right)
        return await self._inner.allowed(who, right)

    async def require(self, who: Caller, right: Right, what: str) -> None:
        self._check(who, right)
        await self._inner.require(who, right, what)


@dataclass(frozen=True)
class Call:
    """What a bus method is handed: who calls, and the Authority limited to
    the rights the method declared."""

    who: Caller
    authority: Authority
