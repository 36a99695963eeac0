"""Who is calling and what they may do, as the services see it.

The bus edge learns the caller from the bus daemon and asks polkit; the
services (`Agents`) only name the right they need and get a yes or no, so
they depend on no D-Bus module. The edge's implementation is
`leviathd.bus.polkit.PolkitAuthority`; it asks only when a service asks, so a
right that a call does not need is never put to polkit (or to the user)."""

from __future__ import annotations

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


class Authority(Protocol):
    async def allowed(self, who: Caller, right: Right) -> bool:
        """Fails closed: False when the answer is no or cannot be had."""
        ...

    async def require(self, who: Caller, right: Right, what: str) -> None:
        """Raises AccessDenied naming `what` unless `who` holds `right`."""
        ...
