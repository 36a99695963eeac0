"""The engine behind the filtered sockets: its socket, the daemon's own rootful
podman API service when no socket is configured, the proxy's questions to
it, and the removal of an agent's containers, networks and volumes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import syslog
from typing import Any
from urllib.parse import quote

from leviathd import fsat
from leviathd.enginesock import wire
from leviathd.enginesock.rules import LABEL_AGENT, LABEL_DAEMON
from leviathd.events import Event
from leviathd.paths import runtime_dir
from leviathd.sandbox.engine import ENGINE_ENV
from leviathd.systemd import journal

MAX_REPLY = 8 * 1024 * 1024
CALL_TIMEOUT = 30.0
START_TIMEOUT = 20.0
UNIT = "leviath-engine-api.service"


def service_dir() -> str:
    return os.path.join(runtime_dir(), "engine")


def service_socket() -> str:
    return os.path.join(service_dir(), "podman.sock")


def ref(value: str) -> str:
    return quote(value[:256], safe="")


async def call(
    sock: str, method: str, path: str, body: object = None, *, limit: int = MAX_REPLY
) -> tuple[int, Any]:
    """One request to the engine, its reply parsed as JSON when it is."""
    async def go() -> tuple[int, Any]:
        reader, writer = await asyncio.open_unix_connection(sock, limit=wire.MAX_HEAD)
        try:
            data = b"" if body is None else json.dumps(body).encode()
            head = [f"{method} {path} HTTP/1.1", "Host: docker", "Connection: close"]
            if body is not None:
                head += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
            await writer.drain()
            status, raw = await wire.read_response(reader, limit)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        try:
            return status, json.loads(raw) if raw.strip() else None
        except ValueError:
            return status, raw.decode(errors="replace")
    return await asyncio.wait_for(go(), CALL_TIMEOUT)


async def reachable(sock: str) -> bool:
    try:
        status, _ = await call(sock, "GET", "/_ping")
    except (TimeoutError, OSError, wire.BadRequest, asyncio.IncompleteReadError):
        return False
    return status == 200


async def is_podman(sock: str) -> bool:
    with contextlib.suppress(OSError, asyncio.TimeoutError, wire.BadRequest,
                             asyncio.IncompleteReadError):
        _status, version = await call(sock, "GET", "/version")
        if isinstance(version, dict):
            names = [str(c.get("Name", "")) for c in version.get("Components") or []
                     if isinstance(c, dict)]
            return any("podman" in n.lower() for n in names)
    return False


async def cgroup_driver(sock: str) -> str:
    """The engine's cgroup manager ("cgroupfs", "systemd"), "" if unknown.
    Only with cgroupfs is a cgroup parent a plain path, such as the agent's
    scope; with systemd it must name a slice."""
    with contextlib.suppress(OSError, asyncio.TimeoutError, wire.BadRequest,
                             asyncio.IncompleteReadError):
        _status, info = await call(sock, "GET", "/info")
        if isinstance(info, dict):
            return str(info.get("CgroupDriver") or "")[:40]
    return ""


def service_argv(podman: str, sock: str) -> list[str]:
    """podman's API service as the daemon runs it.

    cgroupfs: the filter gives each container the agent's scope as its cgroup
    parent, a plain path below which runc makes `libpod-<id>` (systemd's
    manager would want a slice, and a scope cannot hold units). conmon stays
    in the service's own cgroup: podman leaves it there when systemd started
    the service (INVOCATION_ID), so the engine keeps its monitor, and the
    container's exit status, when the agent's scope is stopped."""
    return [podman, "--cgroup-manager", "cgroupfs", "system", "service", "--time=0",
            f"unix://{sock}"]


class Service:
    """The daemon's rootful podman API service, on a socket in a root-only
    folder (agents never see it: /run/leviath is hidden from them)."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    async def ensure(self, configured: str | None) -> str:
        if configured:
            return configured
        sock = service_socket()
        async with self._lock:
            if await reachable(sock):
                if await cgroup_driver(sock) == "cgroupfs":
                    return sock
                # Started by an older daemon, with podman's default manager:
                # its containers could not be placed under the agents' scopes.
                await self._stop_unit()
            podman = shutil.which("podman")
            if podman is None:
                raise OSError("podman is not installed, and [sandbox.containers] names no socket")
            dfd = fsat.open_dir(service_dir(), create_mode=0o700)
            try:
                fsat.set_owner_mode(dfd, os.geteuid(), os.getegid(), 0o700)
                fsat.unlink_at(dfd, "podman.sock")
            finally:
                os.close(dfd)
            if not await self._as_unit(podman, sock):
                self._proc = await asyncio.create_subprocess_exec(
                    *service_argv(podman, sock),
                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
                    env=ENGINE_ENV,
                )
            loop = asyncio.get_running_loop()
            deadline = loop.time() + START_TIMEOUT
            while loop.time() < deadline:
                if self._proc is not None and self._proc.returncode is not None:
                    break
                if await reachable(sock):
                    journal.record("podman's API service started for the filtered engine "
                                   "sockets", LEVIATH_EVENT=Event.ENGINE_SERVICE)
                    return sock
                await asyncio.sleep(0.1)
            await self.close()
            raise OSError("podman's API service did not start")

    @staticmethod
    async def _as_unit(podman: str, sock: str) -> bool:
        """podman's service as a unit of its own: not under the daemon's
        sandboxing (capability bounding set, ProtectSystem), which its
        containers would inherit, and alive over a daemon restart."""
        run = shutil.which("systemd-run")
        if run is None or not os.path.isdir("/run/systemd/system"):
            return False
        proc = await asyncio.create_subprocess_exec(
            run, "--quiet", "--collect", f"--unit={UNIT}", "--service-type=exec",
            "--description=podman API service for leviathd's filtered engine sockets",
            *service_argv(podman, sock),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _out, err = await proc.communicate()
        if proc.returncode != 0:
            journal.record(f"systemd-run of podman's API service failed: "
                           f"{err.decode(errors='replace')[-300:]}; running it as a child",
                           priority=syslog.LOG_WARNING, LEVIATH_EVENT=Event.ENGINE_SERVICE)
            return False
        return True

    @staticmethod
    async def _stop_unit() -> None:
        run = shutil.which("systemctl")
        if run is None or not os.path.isdir("/run/systemd/system"):
            return
        proc = await asyncio.create_subprocess_exec(
            run, "stop", UNIT, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            env=ENGINE_ENV)
        await proc.wait()

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


async def _listed(sock: str, kind: str, label: str) -> list[dict[str, Any]]:
    filters = quote(json.dumps({"label": [label]}), safe="")
    path = {"containers": f"/containers/json?all=1&filters={filters}",
            "networks": f"/networks?filters={filters}",
            "volumes": f"/volumes?filters={filters}"}[kind]
    status, got = await call(sock, "GET", path)
    if status != 200:
        return []
    if kind == "volumes":
        got = (got or {}).get("Volumes") if isinstance(got, dict) else None
    return [x for x in got or [] if isinstance(x, dict)]


def _labels(item: dict[str, Any]) -> dict[str, str]:
    labels = item.get("Labels") or {}
    return labels if isinstance(labels, dict) else {}


async def remove(sock: str, daemon: str, keep: set[str], only: str | None = None) -> int:
    """Removes this daemon's containers, networks and volumes of agents not in
    `keep` (or of the agent `only`); returns how many things went."""
    label = f"{LABEL_AGENT}={only}" if only else f"{LABEL_DAEMON}={daemon}"
    gone = 0
    for kind in ("containers", "networks", "volumes"):
        for item in await _listed(sock, kind, label):
            labels = _labels(item)
            agent = labels.get(LABEL_AGENT, "")
            if labels.get(LABEL_DAEMON) != daemon or not agent or agent in keep:
                continue
            if only is not None and agent != only:
                continue
            name = str(item.get("Id") or item.get("Name") or "")
            path = {"containers": f"/containers/{ref(name)}?force=1&v=1",
                    "networks": f"/networks/{ref(name)}",
                    "volumes": f"/volumes/{ref(name)}?force=1"}[kind]
            try:
                status, _ = await call(sock, "DELETE", path)
            except (TimeoutError, OSError, wire.BadRequest, asyncio.IncompleteReadError) as exc:
                status = 0
                journal.record(f"agent {agent}: could not remove {kind} {name[:64]}: {exc}",
                               priority=syslog.LOG_WARNING, LEVIATH_AGENT=agent,
                               LEVIATH_EVENT=Event.ENGINE_CLEANUP)
            if status in (200, 204, 404):
                gone += 1
    return gone
