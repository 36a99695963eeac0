"""What `List` shows of running agents' use (memory and tasks, with their
limits): served from memory and refreshed off the request path, so that a
List costs the same at 5 agents as at 500 (issue 18) instead of three calls
to systemd per agent. The figures are at most a few seconds old; `Get`
still asks live.

A refresh reads each scope's cgroup v2 files (memory.current, pids.current,
memory.max, pids.max) where the unified hierarchy is mounted, else asks
systemd, never more than MAX_IN_FLIGHT at once."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Awaitable, Callable, Iterable

Live = dict[str, int | None]
# fetch(agent id, unit) -> (live figures, the scope's control group or "")
Fetch = Callable[[str, str], Awaitable[tuple[Live, str]]]

USAGE_TTL = 2.0
MAX_IN_FLIGHT = 8
FILL_AT_ONCE = 8
CGROUP_ROOT = "/sys/fs/cgroup"


class UsageCache:
    def __init__(self, fetch: Fetch, *, cgroup_root: str = CGROUP_ROOT) -> None:
        self._fetch = fetch
        self._root = cgroup_root
        self._unified = os.path.exists(os.path.join(cgroup_root, "cgroup.controllers"))
        self._rows: dict[str, Live] = {}
        self._cgroups: dict[str, str] = {}
        self._refreshed = -math.inf
        self._task: asyncio.Task[None] | None = None
        self._seeding: set[asyncio.Task[None]] = set()

    def get(self, agent_id: str) -> Live:
        return dict(self._rows.get(agent_id, {}))

    async def fill(self, agents: Iterable[tuple[str, str]]) -> None:
        """The first figures of agents never measured yet (one just started
        where its cgroup files cannot be read, and systemd is asked), at
        most FILL_AT_ONCE of them: the rest wait for the background."""
        todo = [(a, u) for a, u in agents if a not in self._rows][:FILL_AT_ONCE]
        if todo:
            await asyncio.gather(*(self._one(a, u) for a, u in todo), return_exceptions=True)

    def forget(self, agent_id: str) -> None:
        self._rows.pop(agent_id, None)
        self._cgroups.pop(agent_id, None)

    def seed(self, agent_id: str, unit: str, cgroup: str = "") -> None:
        """A new agent: its first figures, in the background; from its
        cgroup's files alone when `cgroup` (its control group) is given and
        cgroup v2 is mounted, so a start costs systemd nothing more."""
        if cgroup and self._unified and _plain(cgroup):
            self._cgroups[agent_id] = os.path.join(self._root, cgroup.lstrip("/"))
        task = asyncio.get_running_loop().create_task(self._one(agent_id, unit))
        self._seeding.add(task)
        task.add_done_callback(self._seeding.discard)

    def touch(self, running: Iterable[tuple[str, str]]) -> None:
        """Called by List with the running agents (id, unit): when the
        figures are older than USAGE_TTL, refresh them for the next List.
        Never waits."""
        if self._task is not None and not self._task.done():
            return
        if time.monotonic() - self._refreshed < USAGE_TTL:
            return
        self._task = asyncio.get_running_loop().create_task(self._refresh(list(running)))

    async def _refresh(self, running: list[tuple[str, str]]) -> None:
        # The files of every agent whose cgroup is known, read in one thread
        # (thousands of small reads stay off the event loop); systemd for
        # the others, a few at a time.
        known = [(a, self._cgroups[a]) for a, _u in running if a in self._cgroups]
        read = await asyncio.to_thread(lambda: {a: _read_counters(f) for a, f in known})
        for agent_id, got in read.items():
            if got is not None:
                self._rows.setdefault(agent_id, {}).update(got)
        gate = asyncio.Semaphore(MAX_IN_FLIGHT)

        async def one(agent_id: str, unit: str) -> None:
            async with gate:
                await self._one(agent_id, unit)

        rest = [(a, u) for a, u in running if read.get(a) is None]
        await asyncio.gather(*(one(a, u) for a, u in rest), return_exceptions=True)
        live = {a for a, _u in running}
        for agent_id in [a for a in self._rows if a not in live]:
            self.forget(agent_id)
        self._refreshed = time.monotonic()

    async def _one(self, agent_id: str, unit: str) -> None:
        # A row exists only with figures in it: fill() waits for the others.
        folder = self._cgroups.get(agent_id)
        if folder:
            got = _read_counters(folder)
            if got is not None:
                self._rows.setdefault(agent_id, {}).update(got)
                return
        with contextlib.suppress(Exception):
            live, cgroup = await self._fetch(agent_id, unit)
            self._rows[agent_id] = live
            if self._unified and _plain(cgroup):
                self._cgroups[agent_id] = os.path.join(self._root, cgroup.lstrip("/"))


def _plain(cgroup: str) -> bool:
    return cgroup.startswith("/") and ".." not in cgroup.split("/")


_FILES = (("memory", "memory.current"), ("tasks", "pids.current"),
          ("memory_max", "memory.max"), ("tasks_max", "pids.max"))


def _read_counters(folder: str) -> Live | None:
    """Use and limits from a v2 cgroup folder's files ("max": no limit);
    None when it is gone or unreadable (then systemd is asked)."""
    out: Live = {}
    for key, name in _FILES:
        try:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            text = os.read(fd, 64).strip()
        except OSError:
            return None
        finally:
            os.close(fd)
        if text == b"max":
            out[key] = None
        elif text.isdigit():
            out[key] = int(text)
        else:
            return None
    return out
