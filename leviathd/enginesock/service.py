"""The filtered engine sockets in the agent life cycle.

- its spec extension (with the step's effective settings): when
  `[sandbox.containers] enabled` holds for a fenced agent, DOCKER_HOST points
  at `/run/leviath/engine.sock`, in the agent's own folder that the tool gate
  binds in (leviathd/gate/service.py), and the sandbox's view is kept for the
  bind checks;
- its start (after the gate's, which makes the folder): the engine (the
  agent's user's own rootless podman in the agent's scope,
  leviathd/enginesock/rootless.py; only with the machine's
  `host_root_engine` the daemon's rootful podman or a configured socket)
  and the agent's proxy, with a snapshot so a restarted daemon serves the
  agent again;
- its end: the proxy closed; a rootless engine's socket, runtime folder
  and storage removed (its processes ended with the scope), a host-root
  engine asked to remove the agent's containers, networks and volumes;
  `recover` re-opens proxies and sweeps what agents that ended while the
  daemon was away left behind.
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
from leviathd.agents.feature import Feature
from leviathd.agents.service import Agents
from leviathd.config.merge import Effective, MergeResult
from leviathd.config.models import Publish
from leviathd.domain.sandbox import SandboxKind
from leviathd.enginesock import engine, imagestore, pins, rootless
from leviathd.enginesock.proxy import SOCKET_NAME, AgentProxy, Settings
from leviathd.enginesock.view import View, _Entry
from leviathd.errors import NotFound, Unavailable
from leviathd.events import Event
from leviathd.gate.service import CA_BUNDLE, SANDBOX_RUNTIME, GateService, agent_dir
from leviathd.identity import UserInfo, user_info
from leviathd.paths import runtime_dir
from leviathd.records import AgentRecord
from leviathd.sandbox.container import daemon_instance
from leviathd.sandbox.forwarder import proxy_env
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


SCOPE_EMPTY_WAIT = 30.0
# How long a new agent's start waits for the ends of its user's other agents
# to have kept their images.
KEEP_WAIT = 300.0


def _scope_procs(cgroup: str) -> bool:
    """Whether any process is left in the scope's control group (a missing
    group holds none)."""
    for top in folders(cgroup):
        try:
            with open(os.path.join(top, "cgroup.procs"), encoding="ascii") as f:
                if f.read(64).strip():
                    return True
        except OSError:
            continue
    return False


async def _scope_emptied(unit: str) -> None:
    cgroup = control_group(unit)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SCOPE_EMPTY_WAIT
    while await asyncio.to_thread(_scope_procs, cgroup):
        if loop.time() > deadline:
            journal.record(f"{unit}: processes still in it {SCOPE_EMPTY_WAIT:.0f} s after its "
                           "stop; removing its engine's storage anyway",
                           priority=syslog.LOG_WARNING, LEVIATH_EVENT=Event.ENGINE_CLEANUP)
            return
        await asyncio.sleep(0.2)


class EngineSockService(Feature):
    # podman's API service may take seconds to start: not in the way of READY.
    recovers_in_background = True
    close_timeout = 12.0

    def __init__(self, agents: Agents, gate: GateService, *, state_dir: str) -> None:
        self._agents = agents
        self._state_dir = state_dir
        self._gate = gate
        self._snapshots = os.path.join(state_dir, "enginesock")
        self._pending: dict[str, tuple[View, Effective]] = {}
        self.live: dict[str, AgentProxy] = {}
        # Agents whose images are to be kept: set once their end has copied
        # them (or failed to). An attached `lev run` returns before that.
        self._kept: dict[str, tuple[int, asyncio.Event]] = {}
        self.service = engine.Service()

    def extend_effective(self, spec: SandboxSpec, eff: Effective) -> SandboxSpec:
        if not eff.containers.enabled or spec.kind not in ("namespace", "container"):
            return spec
        if not any(m.target == SANDBOX_RUNTIME and m.kind == "bind" for m in spec.mounts):
            return replace(spec, notes=(*spec.notes, "container engine socket not bound: the "
                                        "agent's socket folder is not in its sandbox"))
        storage = os.path.join(self._state_dir, rootless.STORAGE)
        images = os.path.join(self._state_dir, imagestore.STORE)
        refused: tuple[str, ...] = (runtime_dir(), os.path.realpath(runtime_dir()),
                                    engine.service_dir(), storage, os.path.realpath(storage),
                                    images, os.path.realpath(images))
        if eff.containers.socket:
            refused = (*refused, eff.containers.socket)
        if eff.containers.host_root:
            note = ("container engine: ROOT ON THE HOST ([sandbox.containers] host_root_engine "
                    "= true): a container the filter lets through holds root's rights")
        else:
            note = ("container engine: the user's own rootless podman, in the agent's scope and "
                    "in the agent's own view (what this sandbox shows, nothing else of the "
                    "host's), with storage of its own that goes when the agent ends")
        # Planning runs in worker threads; one entry per agent, the first step's.
        # A start that fails before the hooks leaves its entry: keep few.
        while len(self._pending) >= MAX_PENDING:
            self._pending.pop(next(iter(self._pending)), None)
        self._pending.setdefault(spec.execution_id, (View.from_spec(spec, refused), eff))
        sock = f"unix://{SANDBOX_RUNTIME}/{SOCKET_NAME}"
        return replace(spec, env={**spec.env, "DOCKER_HOST": sock}, notes=(*spec.notes, note))

    async def on_start(self, rec: AgentRecord, merged: MergeResult, user: UserInfo) -> None:
        pending = self._pending.pop(rec.id, None)
        if pending is None:
            return
        view, eff = pending
        if not eff.containers.host_root:
            await self._start_rootless(rec, user, view, eff)
            return
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

    async def _start_rootless(self, rec: AgentRecord, user: UserInfo, view: View,
                              eff: Effective) -> None:
        """The user's own podman for this agent, then its proxy. No cgroup
        parent: the containers are the service's children in the scope."""
        keep = eff.containers.image_store_max
        if keep > 0:
            await self._seed(rec, user)
            self._kept[rec.id] = (user.uid, asyncio.Event())
        try:
            sock = await rootless.start(rec.id, rec.unit, rec.supervisor_pid, user,
                                        self._state_dir, host_network=eff.network is True,
                                        agent_network=eff.network == "proxy",
                                        image=rec.sandbox == SandboxKind.CONTAINER,
                                        trust_bundle=CA_BUNDLE)
        except rootless.RootlessUnavailable as exc:
            await asyncio.to_thread(rootless.remove, rec.id, self._state_dir)
            raise Unavailable(f"the agent's container engine (rootless podman as "
                              f"{user.name}) cannot run here: {exc.strerror or exc}") from None
        except OSError as exc:
            raise Unavailable(f"the agent's container engine (rootless podman as "
                              f"{user.name}): {exc.strerror or exc}") from None
        settings = Settings(
            agent_id=rec.id, uid=user.uid, gid=user.gid, cap_add=eff.containers.cap_add,
            publish_any=eff.containers.publish == Publish.ANY, engine=sock, podman=True,
            daemon=daemon_instance(), cgroup="", rootless=True,
            engine_offline=eff.network is not True, upload_max=eff.containers.upload_max,
            egress_env=_egress_env() if eff.network == "proxy" else (), image_store_max=keep,
        )
        await self._open(settings, view)
        await asyncio.to_thread(self._save, settings, view)

    async def _seed(self, rec: AgentRecord, user: UserInfo) -> None:
        """The user's kept images into the agent's new storage, before its
        engine runs; an agent whose copy fails starts with what was copied."""
        # What the user's agents that have ended keep is copied first: the
        # user's next `lev run` may come while their ends are still at it.
        ending = [ev for agent_id, (uid, ev) in list(self._kept.items())
                  if uid == user.uid and not self._running(agent_id)]
        if ending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(ev.wait() for ev in ending)),
                                       KEEP_WAIT)
        try:
            await asyncio.to_thread(rootless.prepare, rec.id, self._state_dir, user)
            got = await imagestore.seed(rec.id, self._state_dir, user)
        except (OSError, ValueError) as exc:
            journal.record(f"agent {rec.id}: its user's kept images could not be copied in: "
                           f"{exc}", priority=syslog.LOG_WARNING, LEVIATH_AGENT=rec.id,
                           LEVIATH_EVENT=Event.ENGINE_SERVICE)
            return
        if got.get("seeded") or got.get("said"):
            journal.record(f"agent {rec.id}: kept images copied into its engine: "
                           f"{', '.join(got.get('seeded') or []) or 'none'}"
                           + (f" ({got['said']})" if got.get("said") else ""),
                           LEVIATH_AGENT=rec.id, LEVIATH_EVENT=Event.ENGINE_SERVICE)

    def _running(self, agent_id: str) -> bool:
        rec = self._agents.records.get(agent_id)
        return rec is not None and rec.running

    @staticmethod
    async def _keep(rec: AgentRecord, settings: Settings, state_dir: str) -> None:
        """The ended agent's named images into its user's store (once its
        scope is empty, before its storage goes)."""
        try:
            user = await asyncio.to_thread(user_info, settings.uid)
            got = await imagestore.save(rec.id, state_dir, user, settings.image_store_max)
        except (OSError, ValueError, NotFound) as exc:
            journal.record(f"agent {rec.id}: its images could not be kept: {exc}",
                           priority=syslog.LOG_WARNING, LEVIATH_AGENT=rec.id,
                           LEVIATH_EVENT=Event.ENGINE_CLEANUP)
            return
        journal.record(f"agent {rec.id}: images kept for its user's next agents: "
                       f"{', '.join(got.get('saved') or []) or 'none'}; removed from the store "
                       f"past image_store_max: {', '.join(got.get('pruned') or []) or 'none'}"
                       + (f" ({got['said']})" if got.get("said") else ""),
                       LEVIATH_AGENT=rec.id, LEVIATH_EVENT=Event.ENGINE_CLEANUP)

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
        try:
            await self._end(rec)
        finally:
            kept = self._kept.pop(rec.id, None)
            if kept is not None:
                kept[1].set()

    async def _end(self, rec: AgentRecord) -> None:
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
                # No snapshot (its start failed half way, say): what a rootless
                # engine may have left is still its folders.
                if await asyncio.to_thread(rootless.has_folders, rec.id, self._state_dir):
                    await _scope_emptied(rec.unit)
                    with contextlib.suppress(OSError):
                        await asyncio.to_thread(rootless.remove, rec.id, self._state_dir)
                await _release_pins(rec.id)
                return
        with contextlib.suppress(OSError):
            self._forget(rec.id)
        if settings.rootless:
            # Its service, conmon and containers are processes of the scope,
            # which the daemon has asked systemd to stop: once they are gone
            # (a container's PID 1 ignores SIGTERM: up to the scope's stop
            # timeout), what is left are files.
            await _scope_emptied(rec.unit)
            # The pins only once nothing of the engine can start a container
            # from them again.
            await _release_pins(rec.id)
            if settings.image_store_max > 0:
                await self._keep(rec, settings, self._state_dir)
            try:
                await asyncio.to_thread(rootless.remove, rec.id, self._state_dir)
            except OSError as exc:
                journal.record(f"agent {rec.id}: its engine's storage could not be removed: "
                               f"{exc}", priority=syslog.LOG_WARNING, LEVIATH_AGENT=rec.id,
                               LEVIATH_EVENT=Event.ENGINE_CLEANUP)
            return
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
                if not settings.rootless:
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
        for agent_id in await asyncio.to_thread(rootless.left_behind, self._state_dir):
            if agent_id not in running:
                try:
                    await asyncio.to_thread(rootless.remove, agent_id, self._state_dir)
                except OSError as exc:
                    journal.record(f"agent {agent_id}: its engine's storage could not be "
                                   f"removed: {exc}", priority=syslog.LOG_WARNING,
                                   LEVIATH_AGENT=agent_id, LEVIATH_EVENT=Event.ENGINE_CLEANUP)
        machine = self._agents.machine_config.sandbox
        configured = machine.containers if machine is not None else None
        if configured is not None and configured.enabled and configured.host_root_engine:
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
        settings = Settings(**{**s, "cap_add": tuple(s["cap_add"]),
                               "egress_env": tuple(s.get("egress_env") or ())})
        v = data["view"]
        view = View(tuple(_Entry(**e) for e in v["entries"]), tuple(v["hidden"]),
                    tuple(v["masks"]), tuple(v["refused"]))
        return settings, view


def _egress_env() -> tuple[str, ...]:
    """The agent's own proxy variables (127.0.0.1:3128 of its network
    namespace, which its containers share), for its containers' environment."""
    return tuple(f"{k}={v}" for k, v in sorted(proxy_env().items()))


async def _release_pins(agent_id: str) -> None:
    """The ended agent's pinned bind sources (leviathd/enginesock/pins.py)."""
    try:
        await asyncio.to_thread(pins.release, agent_id)
    except pins.PinError as exc:
        journal.record(f"agent {agent_id}: its pinned binds could not be removed: {exc}",
                       priority=syslog.LOG_WARNING, LEVIATH_AGENT=agent_id,
                       LEVIATH_EVENT=Event.ENGINE_CLEANUP)
