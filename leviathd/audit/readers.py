"""The daemon's journal readers: the root `journalctl` (or `tail`) behind
each `Logs` and `Audit` call, writing into a pipe the caller holds.

Each one costs a root process, and one that follows lives until the agent
ends; a reader whose caller stops reading blocks on a full pipe for ever.
So they are capped per caller (uid) and in total, and each ends when the
bus connection that asked for it goes (told by a `CallerWatch`, which the bus
edge implements with the bus driver's NameOwnerChanged), when its agent ends
(followers), or when it finishes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from leviathd.authority import Caller
from leviathd.errors import LeviathError

PER_CALLER = 8
TOTAL = 32


class CallerWatch(Protocol):
    """Tells when a caller (a bus connection's unique name) has gone."""

    def on_gone(self, handler: Callable[[str], None]) -> None:
        """`handler(sender)` runs when a watched sender leaves."""

    async def watch(self, sender: str) -> None: ...

    async def unwatch(self, sender: str) -> None: ...

    async def has_owner(self, sender: str) -> bool:
        """Whether `sender` is still connected."""
        ...


class TooManyReaders(LeviathError):
    dbus_name = "org.leviath.Error.LimitExceeded"


@dataclass(eq=False)
class _Reader:
    proc: asyncio.subprocess.Process
    uid: int
    sender: str
    agent_id: str
    follow: bool


@dataclass
class Readers:
    callers: CallerWatch
    per_caller: int = PER_CALLER
    total: int = TOTAL
    _live: set[_Reader] = field(default_factory=set)
    _starting: Counter[int] = field(default_factory=Counter)
    _watched: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.callers.on_gone(self._gone)

    def count(self, uid: int | None = None) -> int:
        """Readers running or being started (of `uid`, or all)."""
        live = sum(1 for r in self._live if uid is None or r.uid == uid)
        return live + (sum(self._starting.values()) if uid is None else self._starting[uid])

    async def start(
        self, who: Caller, argv: Sequence[str], *, agent_id: str, follow: bool
    ) -> int:
        """Run `argv` with its output on a new pipe; returns the read end
        (the caller's to send and close)."""
        if self.count(who.uid) >= self.per_caller:
            raise TooManyReaders(
                f"you already have {self.per_caller} log or audit readers open (the limit); "
                "end one first"
            )
        if self.count() >= self.total:
            raise TooManyReaders(
                f"leviathd already runs {self.total} log or audit readers (the limit); "
                "try again later"
            )
        # Held from the check on, before the first await: calls sent all at
        # once run interleaved, and each must see the others' places taken.
        # The place passes to the reader itself once it is live.
        self._starting[who.uid] += 1
        place = [who.uid]
        try:
            return await self._start(who, argv, place, agent_id=agent_id, follow=follow)
        finally:
            self._release(place)

    def _release(self, place: list[int]) -> None:
        """Give back a place taken in start(), once."""
        if place:
            uid = place.pop()
            self._starting[uid] -= 1
            if not self._starting[uid]:
                del self._starting[uid]

    async def _start(
        self, who: Caller, argv: Sequence[str], place: list[int], *, agent_id: str,
        follow: bool,
    ) -> int:
        await self._watch(who.sender)
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=write_fd,
                stderr=asyncio.subprocess.DEVNULL,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        reader = _Reader(proc, who.uid, who.sender, agent_id, follow)
        self._release(place)
        self._live.add(reader)
        asyncio.get_running_loop().create_task(self._reap(reader))
        if not await self._has_owner(who.sender):
            # Gone between the call and our match rule: no signal will come.
            self._end(lambda r: r.sender == who.sender)
        return read_fd

    def end_agent(self, agent_id: str) -> None:
        """The agent ended: its followers have nothing more to wait for."""
        self._end(lambda r: r.agent_id == agent_id and r.follow)

    def close(self) -> None:
        self._end(lambda r: True)

    # -- internals ----------------------------------------------------------

    def _end(self, which: Callable[[_Reader], bool]) -> None:
        for reader in [r for r in self._live if which(r)]:
            with contextlib.suppress(ProcessLookupError):
                reader.proc.send_signal(signal.SIGTERM)

    async def _reap(self, reader: _Reader) -> None:
        try:
            await reader.proc.wait()
        finally:
            self._live.discard(reader)
            if not any(r.sender == reader.sender for r in self._live):
                await self._unwatch(reader.sender)

    def _gone(self, sender: str) -> None:
        if sender in self._watched:
            self._end(lambda r: r.sender == sender)

    async def _watch(self, sender: str) -> None:
        if sender in self._watched:
            return
        self._watched.add(sender)
        await self.callers.watch(sender)

    async def _unwatch(self, sender: str) -> None:
        if sender in self._watched:
            self._watched.discard(sender)
            with contextlib.suppress(Exception):
                await self.callers.unwatch(sender)

    async def _has_owner(self, sender: str) -> bool:
        return await self.callers.has_owner(sender)
