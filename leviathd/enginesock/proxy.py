"""One agent's filtered engine socket: a unix socket the agent alone may use,
each connection one request, checked by leviathd/enginesock/rules.py and then
passed to the engine with its reply (or a hijacked stream) copied back.

One request per connection: the engine is asked with `Connection: close`,
and nothing the client sends after the request's body is passed on except
on a hijacked stream (attach, exec start), which is a container's stdin by
then. So a second request can never ride an allowed one unread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import syslog
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from leviathd import fdshare, fsat, metrics, parseshare
from leviathd.broker.server import identify
from leviathd.enginesock import engine, health, pins, rules, wire
from leviathd.enginesock.view import BindRefused, View
from leviathd.errors import AccessDenied
from leviathd.events import Event
from leviathd.systemd import journal

SOCKET_NAME = "engine.sock"
MAX_JSON_BODY = 1024 * 1024
MAX_CONNECTIONS = 64
OWN_CACHE = 1024
_FULL_ID = re.compile(r"^[0-9a-f]{64}\Z")
# Seconds between the inspects of a thing the engine answered with a 5xx
# (_inspect): a container's exit cleanup holds it well under a second.
INSPECT_RETRY = (0.1, 0.3, 1.0)
# The only headers of the agent's that reach the engine (rebuilt, name and
# value checked by wire.parse_head): the body's type and a registry's
# credentials for a pull or build. The framing headers are ours.
_PASSED = {"content-type": "Content-Type", "x-registry-auth": "X-Registry-Auth",
           "x-registry-config": "X-Registry-Config"}


@dataclass(frozen=True)
class Settings:
    agent_id: str
    uid: int
    gid: int
    cap_add: tuple[str, ...]
    publish_any: bool
    engine: str  # the engine's socket
    podman: bool
    daemon: str
    # The agent's scope's control group, the cgroup parent of every container
    # it creates; "" where the engine cannot place them there (its cgroup
    # manager is not cgroupfs: a configured Docker socket, say).
    cgroup: str = ""
    # The engine is the agent's user's own rootless podman (enginesock/rootless.py):
    # a container's root is that user on the host.
    rootless: bool = False
    # The engine's network namespace has only lo (rootless, the agent's
    # network not true): rules.Checks.engine_offline.
    engine_offline: bool = False
    # network = "proxy": the engine runs in the agent's own network namespace,
    # and a container on the default network shares it, with these
    # "NAME=value" settings (the agent's proxy variables) added to its
    # environment: rules.Checks.egress_env.
    egress_env: tuple[str, ...] = ()
    # [sandbox.containers] upload_max: bytes of streamed request bodies over
    # the agent's life (config.merge.UPLOAD_MAX_DEFAULT when unset).
    upload_max: int = 4 << 30
    # [sandbox.containers] image_store_max: the user's image store's bound
    # (rootless only; enginesock/imagestore.py), 0 for none kept.
    image_store_max: int = 0


class AgentProxy:
    """Implements rules.Checks for one agent."""

    def __init__(self, settings: Settings, view: View, lookup: Callable[[str], str | None],
                 on_change: Callable[[], None] | None = None) -> None:
        self.s = settings
        # Told before a request that runs or stores something in the engine
        # is forwarded (the agent's taint: Broker.engine_changed).
        self._on_change = on_change
        self.view = view
        self.lookup = lookup
        self.agent_id = settings.agent_id
        self.cap_add = settings.cap_add
        self.publish_any = settings.publish_any
        self.uid = settings.uid
        self.gid = settings.gid
        self.podman = settings.podman
        self.daemon = settings.daemon
        self.cgroup_parent = settings.cgroup
        self.rootless = settings.rootless
        self.engine_offline = settings.engine_offline
        self.egress_env = settings.egress_env
        self._server: asyncio.AbstractServer | None = None
        self._own: dict[str, dict[str, Any]] = {}
        self._connections = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.pins = pins.Pins(settings.agent_id)
        self.uploaded = 0  # streamed body bytes passed to the engine (upload_max)
        # The rootless engine's healthcheck timer (rootful podman has root's
        # systemd timers for that).
        self.health = health.Health(settings.engine, settings.agent_id) if (
            settings.rootless) else None

    # -- the socket -------------------------------------------------------

    async def start(self, folder: str) -> None:
        dfd = fsat.open_dir(folder)
        try:
            sock = fsat.bind_unix_at(dfd, SOCKET_NAME, mode=0o600, uid=self.uid, gid=self.gid)
        finally:
            os.close(dfd)
        extra: dict[str, Any] = {"cleanup_socket": False} if sys.version_info >= (3, 13) else {}
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, sock=sock, limit=wire.MAX_HEAD, **extra)
        except BaseException:
            sock.close()
            raise
        if self.health is not None:
            self.health.kick()  # (an adopted agent's containers may be running)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        if self.health is not None:
            await self.health.close()

    # -- rules.Checks -----------------------------------------------------

    async def _inspect(self, path: str, what: str, name: str) -> dict[str, Any]:
        """The engine's inspect of `path`. Only the engine's 404 is "no such":
        podman 4.3 once failed the look-up of a container that had just exited
        (a cleanup process of its own works on it then), and the client must
        not hear that its container is gone; a failure (5xx, or a 200 that is
        not an object) is asked again a moment later."""
        for delay in (*INSPECT_RETRY, None):
            try:
                status, got = await engine.call(self.s.engine, "GET", path)
            except (TimeoutError, OSError, wire.BadRequest, asyncio.IncompleteReadError) as exc:
                raise rules.Refused(f"the engine did not answer: {exc}", 502) from None
            if status == 200 and isinstance(got, dict):
                return got
            if status == 404:
                raise rules.Refused(f"no such {what}: {name[:100]}", 404)
            if (status < 500 and status != 200) or delay is None:
                break
            await asyncio.sleep(delay)
        # The engine's words stay in the journal: they may name a thing that is
        # another agent's (a host-root engine), which this agent must not learn.
        said = got.get("message") if isinstance(got, dict) else got
        journal.record(f"agent {self.agent_id}: the engine answered {status} to {path[:160]}: "
                       f"{str(said)[:300]}", priority=syslog.LOG_WARNING,
                       LEVIATH_AGENT=self.agent_id, LEVIATH_EVENT=Event.ENGINE_REFUSED)
        raise rules.Refused(f"the engine could not look up the {what} {name[:100]} "
                            f"(status {status}); try again", 502)

    def _mine(self, got: dict[str, Any], labels: object, what: str, name: str) -> dict[str, Any]:
        if not isinstance(labels, dict) or labels.get(rules.LABEL_AGENT) != self.agent_id:
            # The same answer as for a missing one: another agent's things
            # are not even there for this one.
            raise rules.Refused(f"no such {what}: {name[:100]} (an agent sees only its own)", 404)
        return got

    async def container(self, ref: str) -> dict[str, Any]:
        # By full id only: ids are never reused and labels never change, while
        # a name may pass to another container once its holder is removed.
        cached = self._own.get(ref)
        if cached is not None:
            return cached
        got = await self._inspect(f"/containers/{engine.ref(ref)}/json", "container", ref)
        mine = self._mine(got, (got.get("Config") or {}).get("Labels"), "container", ref)
        cid = str(mine.get("Id", ""))
        if _FULL_ID.match(cid):
            if len(self._own) >= OWN_CACHE:
                self._own.pop(next(iter(self._own)))
            self._own[cid] = {"Id": cid, "Name": mine.get("Name", ""),
                              "Config": {"Labels": dict((mine.get("Config") or {})
                                                        .get("Labels") or {})}}
        return mine

    async def network(self, ref: str) -> dict[str, Any]:
        got = await self._inspect(f"/networks/{engine.ref(ref)}", "network", ref)
        return self._mine(got, got.get("Labels"), "network", ref)

    async def volume(self, name: str, *, create: bool) -> dict[str, Any]:
        try:
            got = await self._inspect(f"/volumes/{engine.ref(name)}", "volume", name)
        except rules.Refused as exc:
            if exc.status != 404 or not create:
                raise
            labels = {rules.LABEL_AGENT: self.agent_id, rules.LABEL_DAEMON: self.daemon}
            status, made = await engine.call(self.s.engine, "POST", "/volumes/create",
                                             {"Name": name[:256], "Labels": labels})
            if status not in (200, 201) or not isinstance(made, dict):
                raise rules.Refused(f"could not create the volume {name[:100]}", 502) from None
            self._audit(f"volume create {name[:64]}", allowed=True)
            return made
        return self._mine(got, got.get("Labels"), "volume", name)

    async def image(self, ref: str) -> dict[str, Any]:
        return await self._inspect(f"/images/{engine.ref(ref)}/json", "image", ref)

    async def exec_container(self, exec_id: str) -> dict[str, Any]:
        got = await self._inspect(f"/exec/{engine.ref(exec_id)}/json", "exec instance", exec_id)
        return await self.container(str(got.get("ContainerID") or ""))

    def parent_controllers(self) -> frozenset[str] | None:
        return parent_controllers(self.cgroup_parent)

    async def bind(self, path: str, writable: bool) -> tuple[str, bool]:
        try:
            real, readonly = await asyncio.to_thread(self.view.resolve, path, writable)
            if self.rootless:
                # The engine runs in the agent's view (enginesock/engineroot.py):
                # it binds what the agent sees there, the fence's read-only
                # mounts inside included; a link swapped in later leads
                # nowhere the agent cannot go itself.
                return self.view.seen_as(real), readonly
            return await asyncio.to_thread(self._pin, real), readonly
        except BindRefused as exc:
            raise rules.Refused(str(exc)) from None
        except pins.PinError as exc:
            raise rules.Refused(f"bind of {path[:200]}: {exc}") from None
        except OSError as exc:
            raise rules.Refused(f"bind of {path[:200]}: {exc.strerror}") from None

    def _pin(self, real: str) -> str:
        """The engine's path for the checked `real`: the object it names now,
        held by a mount the agent cannot change (leviathd/enginesock/pins.py)."""
        return self.pins.pin(real, self.uid, self.gid)

    # -- one connection -----------------------------------------------------

    def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The client's and the engine's descriptors, charged to the agent's user.
        serve = fdshare.charged(self.uid, 2, self._connection)
        task = asyncio.get_running_loop().create_task(serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        try:
            if self._connections >= MAX_CONNECTIONS:
                writer.write(wire.error_reply(503, "leviathd: too many connections to the "
                                              "filtered engine socket"))
                return
            self._connections += 1
            try:
                peer = identify(writer.get_extra_info("socket"))
                if self.lookup(peer.cgroup) != self.agent_id or peer.uid != self.uid:
                    raise AccessDenied(f"pid {peer.pid} is not agent {self.agent_id}")
                await self._request(reader, writer)
            finally:
                self._connections -= 1
        except (TimeoutError, AccessDenied, OSError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError):
            pass
        except wire.BadRequest as exc:
            with contextlib.suppress(OSError):
                writer.write(wire.error_reply(400, f"leviathd: {exc}"))
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                await writer.drain()
            writer.close()

    async def _request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await wire.read_head(reader)
        if head is None:
            return
        body: bytes | None = None
        if rules.wants_json_body(head.method, head.path):
            body = await wire.read_body(reader, head, MAX_JSON_BODY)
            # Parsed in the daemon's process: paced by the user's share.
            await parseshare.pace(self.uid, len(body or b""))
        try:
            decision = await rules.decide(head.method, head.path, head.query, body, self)
        except rules.Refused as exc:
            self._audit(f"{head.method} {head.path[:120]}: {exc.message}", allowed=False)
            writer.write(wire.error_reply(exc.status, f"leviathd: {exc.message}"))
            return
        if decision.body is None:
            kind, length = head.body_kind()
            left = max(0, self.s.upload_max - self.uploaded)
            if kind == "length" and length > left:
                # Before the engine is even dialled (chunked bodies are
                # counted as they pass: _forward).
                self._over(writer, length, left)
                return
        if decision.mutating:
            self._audit(decision.what, allowed=True)
        if (decision.mutating or decision.upgrade) and self._on_change is not None:
            self._on_change()
        await self._forward(head, decision, reader, writer)
        if self.health is not None and decision.what.startswith(("container start",
                                                                  "container restart",
                                                                  "container unpause")):
            self.health.kick()

    async def _forward(self, head: wire.Head, d: rules.Decision, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        try:
            er, ew = await asyncio.open_unix_connection(self.s.engine, limit=wire.MAX_HEAD)
        except OSError as exc:
            writer.write(wire.error_reply(502, f"leviathd: the engine is not reachable: "
                                          f"{exc.strerror}"))
            return
        try:
            headers = [(_PASSED[k.lower()], v) for k, v in head.headers if k.lower() in _PASSED]
            headers.append(("Host", "docker"))
            if d.upgrade and head.get("upgrade"):
                # The one protocol the docker CLI asks the engine for.
                headers += [("Connection", "Upgrade"), ("Upgrade", "tcp")]
            else:
                headers.append(("Connection", "close"))
            if d.body is not None:
                headers.append(("Content-Length", str(len(d.body))))
                ew.write(head.encode(d.target, headers) + d.body)
            else:
                kind, length = head.body_kind()
                if kind == "chunked":
                    headers.append(("Transfer-Encoding", "chunked"))
                elif kind == "length":
                    headers.append(("Content-Length", str(length)))
                left = max(0, self.s.upload_max - self.uploaded)
                ew.write(head.encode(d.target, headers))
                try:
                    self.uploaded += await wire.copy_body(reader, head, ew, left)
                except wire.TooLarge as exc:
                    # The engine's connection is closed mid-body: it drops
                    # the request, having stored nothing whole.
                    self.uploaded += int(exc.args[1])
                    self._over(writer, None, left)
                    return
            await ew.drain()
            if d.upgrade and not await _stream_taken(er, writer):
                return
            back = asyncio.ensure_future(_copy(er, writer))
            if d.upgrade:
                forth = asyncio.ensure_future(_copy(reader, ew, eof=True))
            else:
                # Nothing more is passed on; the client's end only ends the reply.
                forth = asyncio.ensure_future(_drain_until_eof(reader))
            try:
                done, _pending = await asyncio.wait({back, forth},
                                                    return_when=asyncio.FIRST_COMPLETED)
                if forth in done and back not in done and d.upgrade:
                    await back  # stdin closed: the output still comes
            finally:
                for t in (back, forth):
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, OSError):
                        await t
        finally:
            ew.close()

    def _over(self, writer: asyncio.StreamWriter, size: int | None, left: int) -> None:
        what = f"of {size} bytes " if size is not None else ""
        message = (f"this upload {what}is over what the agent may still send to the engine: "
                   f"{left} of its {self.s.upload_max} bytes ([sandbox.containers] upload_max)")
        self._audit(message, allowed=False)
        writer.write(wire.error_reply(413, f"leviathd: {message}"))

    def _audit(self, what: str, *, allowed: bool) -> None:
        if not allowed:
            metrics.refused("engine")
        journal.record(
            f"agent {self.agent_id}: engine socket {'allowed' if allowed else 'refused'} {what}",
            priority=syslog.LOG_INFO if allowed else syslog.LOG_WARNING,
            LEVIATH_AGENT=self.agent_id,
            LEVIATH_EVENT=Event.ENGINE_ALLOWED if allowed else Event.ENGINE_REFUSED,
        )


def parent_controllers(cgroup: str) -> frozenset[str] | None:
    """The controllers `cgroup` passes to its children on a pure cgroup v2
    host (its cgroup.subtree_control), None on v1 and hybrid hosts, where
    runc makes the container's cgroup in every v1 hierarchy."""
    if not cgroup or not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return None
    try:
        with open(f"/sys/fs/cgroup{cgroup}/cgroup.subtree_control", encoding="ascii") as f:
            return frozenset(f.read(4096).split())
    except (OSError, ValueError):
        return frozenset()


async def _stream_taken(er: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Passes the engine's reply head on; True when the engine took the
    connection over as a stream (101, or a 200 with no length). Otherwise
    (a detached exec, an error before the stream) only the reply's framed
    body follows: the engine keeps the connection for a next request, and
    the client's bytes behind its request must not be read as one."""
    try:
        raw = await er.readuntil(b"\r\n\r\n")
        status, head = wire.response_head(raw)
        writer.write(raw)
        kind, _length = head.body_kind()
        if status == 101 or (status == 200 and kind == "none"):
            return True
        await wire.copy_body(er, head, writer)
        await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, wire.BadRequest):
        pass
    return False


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                eof: bool = False) -> None:
    while data := await reader.read(wire.COPY_CHUNK):
        writer.write(data)
        await writer.drain()
    if eof and writer.can_write_eof():
        with contextlib.suppress(OSError):
            writer.write_eof()


async def _drain_until_eof(reader: asyncio.StreamReader) -> None:
    while await reader.read(wire.COPY_CHUNK):
        pass
