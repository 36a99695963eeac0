"""The filtered engine sockets in the agent life cycle.

- a spec extension (with the step's effective settings): when
  `[sandbox.containers] enabled` holds for a fenced agent, DOCKER_HOST points
  at `/run/leviath/engine.sock`, in the agent's own folder that the tool gate
  binds in (leviathd/gate/service.py), and the sandbox's view is kept for the
  bind checks;
- a start hook (after the gate's, which makes the folder): the engine (the
  daemon's podman service unless a socket is configured) and the agent's
  proxy, with a snapshot so a restarted daemon serves the agent again;
- an end hook: the proxy closed, the agent's containers, networks and volumes
  removed; `recover` re-opens proxies and sweeps what agents that ended while
  the daemon was away left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import syslog
from dataclasses import asdict, replace
from typing import Any

from leviathd import fsat
from leviathd.agents.service import Agents
from leviathd.config.merge import Effective, MergeResult
from leviathd.config.models import Publish
from leviathd.enginesock import engine, pins
from leviathd.enginesock.proxy import SOCKET_NAME, AgentProxy, Settings
from leviathd.enginesock.view import View, _Entry
from leviathd.errors import Unavailable
from leviathd.events import Event
from leviathd.gate.service import SANDBOX_RUNTIME, GateService, agent_dir
from leviathd.identity import UserInfo
from leviathd.paths import runtime_dir
from leviathd.records import AgentRecord
from leviathd.sandbox.container import daemon_instance
from leviathd.sandbox.spec import SandboxSpec
from leviathd.systemd import journal
from leviathd.systemd.absent import control_group
from leviathd.systemd.cgroupfs import folders

MAX_PENDING = 256


def remove_cgroups(cgroup: str) -> None:
    """The empty control groups runc left below the agent's (gone) scope.
    In the v1 hierarchies systemd does not manage for a scope (cpuset,
    cpuacct, freezer...) runc made the scope's folder itself, and nothing
    else removes it; a container an engine restarted after the scope's stop
    may also have made them again in the others. Only empty ones go (rmdir
    of a cgroup with processes or children fails), deepest first."""
    for top in folders(cgroup):
        if not os.path.isdir(top):
            continue
        found = [d for d, _subdirs, _files in os.walk(top)]
        for d in sorted(found, key=lambda d: d.count("/"), reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(d)


class EngineSockService:
    def __init__(self, agents: Agents, gate: GateService, *, state_dir: str) -> None:
        self._agents = agents
        self._gate = gate
        self._snapshots = os.path.join(state_dir, "enginesock")
        self._pending: dict[str, tuple[View, Effective]] = {}
        self.live: dict[str, AgentProxy] = {}
        self.service = engine.Service()

    def install(self) -> None:
        self._agents.effective_spec_extensions.append(self.extend_spec)
        self._agents.start_hooks.append(self.on_start)
        self._agents.end_hooks.append(self.on_end)

    def extend_spec(self, spec: SandboxSpec, eff: Effective) -> SandboxSpec:
        if not eff.containers.enabled or spec.kind not in ("namespace", "container"):
            return spec
        if not any(m.target == SANDBOX_RUNTIME and m.kind == "bind" for m in spec.mounts):
            return replace(spec, notes=(*spec.notes, "container engine socket not bound: the "
                                        "agent's socket folder is not in its sandbox"))
        refused: tuple[str, ...] = (runtime_dir(), os.path.realpath(runtime_dir()),
                                    engine.service_dir())
        if eff.containers.socket:
            refused = (*refused, eff.containers.socket)
        # Planning runs in worker threads; one entry per agent, the first step's.
        # A start that fails before the hooks leaves its entry: keep few.
        while len(self._pending) >= MAX_PENDING:
            self._pending.pop(next(iter(self._pending)), None)
        self._pending.setdefault(spec.execution_id, (View.from_spec(spec, refused), eff))
        sock = f"unix://{SANDBOX_RUNTIME}/{SOCKET_NAME}"
        return replace(spec, env={**spec.env, "DOCKER_HOST": sock})

    async def on_start(self, rec: AgentRecord, merged: MergeResult, user: UserInfo) -> None:
        pending = self._pending.pop(rec.id, None)
        if pending is None:
            return
        view, eff = pending
        try:
            sock = await self.service.ensure(eff.containers.socket)
        except OSError as exc:
            raise Unavailable(f"the container engine for the agent's filtered socket: "
                              f"{exc}") from None
        settings = Settings(
            agent_id=rec.id, uid=user.uid, gid=user.gid, cap_add=eff.containers.cap_add,
            publish_any=eff.containers.publish == Publish.ANY, engine=sock,
            podman=await engine.is_podman(sock), daemon=daemon_instance(),
            cgroup=await self._placement(rec, sock), upload_max=eff.containers.upload_max,
        )
        await self._open(settings, view)
        await asyncio.to_thread(self._save, settings, view)

    @staticmethod
    async def _placement(rec: AgentRecord, sock: str) -> str:
        """The agent's scope's control group as the containers' cgroup parent,
        or "" (with a warning) where the engine cannot put them there."""
        cgroup = control_group(rec.unit)
        driver = await engine.cgroup_driver(sock)
        if driver == "cgroupfs" and any(os.path.isdir(f) for f in folders(cgroup)):
            return cgroup
        journal.record(f"agent {rec.id}: its containers run in the engine's control groups, "
                       f"not under its scope (engine cgroup manager {driver or 'unknown'!r}): "
                       "lev stop and its limits do not reach them",
                       priority=syslog.LOG_WARNING, LEVIATH_AGENT=rec.id,
                       LEVIATH_EVENT=Event.ENGINE_PLACEMENT)
        return ""

    async def _open(self, settings: Settings, view: View) -> None:
        agent_id = settings.agent_id

        def changed() -> None:
            live = self._gate.live.get(agent_id)
            if live is not None:
                live.broker.engine_changed()

        proxy = AgentProxy(settings, view, self._gate.lookup, changed)
        await proxy.start(agent_dir(settings.agent_id))
        self.live[settings.agent_id] = proxy

    async def on_end(self, rec: AgentRecord) -> None:
        self._pending.pop(rec.id, None)
        proxy = self.live.pop(rec.id, None)
        if proxy is not None:
            await proxy.close()
            settings = proxy.s
        else:
            # Not served (it ended while the daemon was away, or its proxy
            # did not come back): its snapshot still names the engine.
            try:
                settings, _view = await asyncio.to_thread(
                    self._load, os.path.join(self._snapshots, f"{rec.id}.json"))
            except (OSError, ValueError, KeyError, TypeError):
                await _release_pins(rec.id)
                return
        with contextlib.suppress(OSError):
            self._forget(rec.id)
        try:
            gone = await engine.remove(settings.engine, settings.daemon, set(), only=rec.id)
        except (TimeoutError, OSError) as exc:
            await _release_pins(rec.id)
            journal.record(f"agent {rec.id}: its containers could not be removed: {exc}",
                           priority=syslog.LOG_WARNING, LEVIATH_AGENT=rec.id,
                           LEVIATH_EVENT=Event.ENGINE_CLEANUP)
            return
        await _release_pins(rec.id)
        if gone:
            journal.record(f"agent {rec.id}: removed {gone} containers, networks and volumes "
                           "it left", LEVIATH_AGENT=rec.id, LEVIATH_EVENT=Event.ENGINE_CLEANUP)
        if settings.cgroup:
            await asyncio.to_thread(remove_cgroups, control_group(rec.unit))

    async def recover(self) -> None:
        """After the gate's recover: proxies for adopted agents, then a sweep
        of what this daemon's ended agents left."""
        running = {r.id for r in self._agents.records.values() if r.running}
        engines: set[str] = set()
        with contextlib.suppress(OSError):
            for name in os.listdir(self._snapshots):
                agent_id = name.removesuffix(".json")
                try:
                    settings, view = self._load(os.path.join(self._snapshots, name))
                except (OSError, ValueError, KeyError, TypeError):
                    self._forget(agent_id)
                    continue
                engines.add(settings.engine)
                if agent_id not in running:
                    self._forget(agent_id)
                    await _release_pins(agent_id)
                    continue
                try:
                    if settings.engine == engine.service_socket():
                        await self.service.ensure(None)
                    await self._open(settings, view)
                except OSError as exc:
                    journal.record(f"agent {agent_id}: no engine socket after the restart: "
                                   f"{exc}", priority=syslog.LOG_WARNING,
                                   LEVIATH_AGENT=agent_id, LEVIATH_EVENT=Event.ENGINE_LOST)
        machine = self._agents.machine_config.sandbox
        configured = machine.containers if machine is not None else None
        if configured is not None and configured.enabled:
            with contextlib.suppress(OSError):
                engines.add(await self.service.ensure(configured.socket))
        for sock in engines:
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                gone = await engine.remove(sock, daemon_instance(), running)
                if gone:
                    journal.record(f"removed {gone} containers, networks and volumes of "
                                   "agents that ended while the daemon was away",
                                   LEVIATH_EVENT=Event.ENGINE_CLEANUP)

    async def close(self) -> None:
        for proxy in list(self.live.values()):
            await proxy.close()
        self.live.clear()
        await self.service.close()

    # -- snapshots --------------------------------------------------------

    def _forget(self, agent_id: str) -> None:
        dfd = fsat.open_dir(self._snapshots)
        try:
            fsat.unlink_at(dfd, f"{agent_id}.json")
        finally:
            os.close(dfd)

    def _save(self, settings: Settings, view: View) -> None:
        data = {"settings": asdict(settings), "view": {
            "entries": [asdict(e) for e in view.entries], "hidden": list(view.hidden),
            "masks": list(view.masks), "refused": list(view.refused)}}
        dfd = fsat.open_dir(self._snapshots, create_mode=0o700)
        try:
            fsat.atomic_write_at(dfd, f"{settings.agent_id}.json", json.dumps(data).encode())
        finally:
            os.close(dfd)

    @staticmethod
    def _load(path: str) -> tuple[Settings, View]:
        with open(path, encoding="utf-8") as f:
            data: dict[str, Any] = json.load(f)
        s = data["settings"]
        settings = Settings(**{**s, "cap_add": tuple(s["cap_add"])})
        v = data["view"]
        view = View(tuple(_Entry(**e) for e in v["entries"]), tuple(v["hidden"]),
                    tuple(v["masks"]), tuple(v["refused"]))
        return settings, view


async def _release_pins(agent_id: str) -> None:
    """The ended agent's pinned bind sources (leviathd/enginesock/pins.py)."""
    try:
        await asyncio.to_thread(pins.release, agent_id)
    except pins.PinError as exc:
        journal.record(f"agent {agent_id}: its pinned binds could not be removed: {exc}",
                       priority=syslog.LOG_WARNING, LEVIATH_AGENT=agent_id,
                       LEVIATH_EVENT=Event.ENGINE_CLEANUP)
