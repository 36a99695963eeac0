"""Healthchecks on an agent's rootless engine (issue 49, item 5).

Rootless podman schedules a container's healthcheck with a timer of the
user's own systemd manager, which the agent's engine (started by the daemon,
in no login session) does not reach: no timer was made and the status never
moved from `starting`. Here the daemon is the timer: for each running
container of the agent's with a healthcheck it asks the engine, every
interval, to run the check (libpod's `GET /containers/ID/healthcheck`, which
runs it and records the result as `podman healthcheck run` does). The check's
processes are the engine's children, so they run in the agent's scope, under
its limits, and end with it; the daemon only sends the request.

The interval is the container's, never under rules.MIN_HEALTH_INTERVAL_NS
(the create already raised it; read back here, it is held again), at most
MAX_CONTAINERS containers, one check of each at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any
from urllib.parse import quote

from leviathd.enginesock import engine, rules, wire

MIN_INTERVAL = rules.MIN_HEALTH_INTERVAL_NS / 1e9
DEFAULT_INTERVAL = 30.0  # Docker's and podman's when the check names none
RESCAN = 10.0  # how often the agent's running containers are listed again
MAX_CONTAINERS = 64
_ENGINE_ERRORS = (TimeoutError, OSError, wire.BadRequest, asyncio.IncompleteReadError)


def interval_of(config: dict[str, Any]) -> float | None:
    """Seconds between checks of a container's `Config`, None: no check."""
    check = config.get("Healthcheck")
    if not isinstance(check, dict):
        return None
    test = check.get("Test")
    if not isinstance(test, list) or not test or test[0] == "NONE":
        return None
    raw = check.get("Interval")
    seconds = raw / 1e9 if isinstance(raw, int) and raw > 0 else DEFAULT_INTERVAL
    return max(MIN_INTERVAL, seconds)


class Health:
    """The healthcheck timer of one agent's engine."""

    def __init__(self, sock: str, agent_id: str) -> None:
        self._sock = sock
        self._agent_id = agent_id
        self._interval: dict[str, float | None] = {}  # container id: seconds (None: no check)
        self._due: dict[str, float] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._kicked = asyncio.Event()

    def kick(self) -> None:
        """A container of the agent's may have started: look again now."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._kicked.set()

    async def close(self) -> None:
        tasks = [t for t in (self._task, *self._running.values()) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, *_ENGINE_ERRORS):
                await t
        self._task = None
        self._running.clear()

    async def _scan(self) -> None:
        filters = json.dumps({"label": [f"{rules.LABEL_AGENT}={self._agent_id}"],
                              "status": ["running"]})
        status, got = await engine.call(self._sock, "GET",
                                        "/containers/json?filters=" + quote(filters))
        if status != 200 or not isinstance(got, list):
            return
        ids = [str(c.get("Id") or "") for c in got[:MAX_CONTAINERS] if isinstance(c, dict)]
        now = asyncio.get_running_loop().time()
        for cid in ids:
            if cid in self._interval:
                continue
            status, info = await engine.call(self._sock, "GET",
                                             f"/containers/{engine.ref(cid)}/json")
            labels = ((info or {}).get("Config") or {}).get("Labels") if isinstance(
                info, dict) else None
            if status != 200 or not rules.own(labels, self._agent_id):
                continue  # (the label filter's answer, checked again)
            every = interval_of(info.get("Config") or {})
            self._interval[cid] = every
            if every is not None:
                self._due[cid] = now + every
        for gone in set(self._interval) - set(ids):
            self._interval.pop(gone, None)
            self._due.pop(gone, None)

    async def _check(self, cid: str) -> None:
        with contextlib.suppress(*_ENGINE_ERRORS):
            await engine.call(self._sock, "GET",
                              f"/v4.0.0/libpod/containers/{engine.ref(cid)}/healthcheck")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_scan = 0.0
        while True:
            now = loop.time()
            if self._kicked.is_set() or now >= next_scan:
                self._kicked.clear()
                with contextlib.suppress(*_ENGINE_ERRORS):
                    await self._scan()
                next_scan = loop.time() + RESCAN
                if not self._due and not self._running and not self._kicked.is_set():
                    return  # nothing to check: the next start kicks it again
            now = loop.time()
            for cid, due in list(self._due.items()):
                every = self._interval.get(cid)
                if due > now or every is None:
                    continue
                self._due[cid] = now + every
                if cid in self._running and not self._running[cid].done():
                    continue  # the last check still runs: one at a time
                self._running[cid] = loop.create_task(self._check(cid))
            for cid in [c for c, t in self._running.items() if t.done()]:
                self._running.pop(cid)
            wake = min([next_scan, *self._due.values()])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kicked.wait(), max(0.0, wake - loop.time()))
