"""The per-agent broker socket: JSON lines over a unix stream socket at
$LEVIATH_RUNTIME_DIR/agents/<id>/broker.sock (bound read-only into the
sandbox as /run/leviath/broker.sock).

Who is calling is decided from the kernel only: SO_PEERCRED gives the peer's
pid and uid, SO_PEERPIDFD pins that exact process, /proc/<pid>/cgroup gives
its cgroup, and the daemon's lookup turns the cgroup into an agent id. A
peer that is not in this socket's agent scope, or not running as the
agent's user, is refused before its first request is read. Nothing in a
request names an agent or a user.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from leviathd import fdshare, fsat, heap, parseshare
from leviathd.broker.core import AuditRecord, Broker, limit_error
from leviathd.broker.limits import descriptor_budget, too_large
from leviathd.broker.requests import Lines, TooLong, parse_request
from leviathd.broker.tools import RawJSON
from leviathd.domain.tools import TOOLS
from leviathd.errors import AccessDenied, LimitExceeded
from leviathd.paths import runtime_dir

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5
# What asyncio buffers per connection before it stops reading from the
# socket; a request line itself is bounded by the agent's request_max_bytes.
READ_CHUNK = 1 << 16
# Request lines up to this long are parsed on the event loop (_handle).
SHORT_LINE = 512
# Broker connections open now, over all agents (see limits.descriptor_budget).
_open_connections = 0

# cgroup path (as in /proc/<pid>/cgroup) → the agent id whose scope it is, or None.
AgentLookup = Callable[[str], str | None]


def socket_path_for(agent_id: str) -> str:
    return os.path.join(runtime_dir(), "agents", agent_id, "broker.sock")


def cgroup_of(pid: int) -> str:
    """The process's systemd cgroup path: the `name=systemd` hierarchy on a
    hybrid/legacy host, else the unified (`0::`) one."""
    unified = None
    with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
        for line in f:
            hier, _, path = line.rstrip("\n").partition(":")
            controllers, _, path = path.partition(":")
            if controllers == "name=systemd":
                return path
            if hier == "0" and controllers == "":
                unified = path
    if unified is None:
        raise AccessDenied(f"pid {pid} has no systemd cgroup")
    return unified


_SCOPE = re.compile(r"^leviath-.+-([0-9a-f]{8})\.scope\Z")


def agent_id_from_cgroup(path: str) -> str | None:
    """The agent id in a `leviath-<user>-<agent>-<id>.scope` cgroup path (the
    scope is the last component that is one; processes may sit below it).
    The daemon confirms the id against its registry before trusting it."""
    for part in reversed(path.split("/")):
        m = _SCOPE.match(part)
        if m:
            return m.group(1)
    return None


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int
    cgroup: str


def identify(sock: socket.socket) -> Peer:
    """The peer's kernel-reported identity. With a pidfd, the cgroup read is
    checked to belong to the process that connected, not a recycled pid."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    if pid <= 0:
        raise AccessDenied("peer has no pid in this pid namespace")
    pidfd = -1
    try:
        pidfd = struct.unpack("i", sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0]
    except OSError:
        pidfd = -1  # older kernel: the pid could in theory be recycled meanwhile
    try:
        try:
            cgroup = cgroup_of(pid)
        except OSError:
            raise AccessDenied(f"peer pid {pid} is gone") from None
        if pidfd >= 0:
            try:
                signal.pidfd_send_signal(pidfd, 0)
            except ProcessLookupError:
                raise AccessDenied(f"peer pid {pid} exited while being identified") from None
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    return Peer(pid, uid, gid, cgroup)


class BrokerServer:
    def __init__(
        self,
        broker: Broker,
        *,
        lookup: AgentLookup,
        path: str | None = None,
        mode: int = 0o600,
    ) -> None:
        self.broker = broker
        self.lookup = lookup
        self.path = path or socket_path_for(broker.agent_id)
        self.mode = mode
        self._server: asyncio.AbstractServer | None = None
        self._connections = 0

    async def start(self) -> None:
        """Bind the socket through a descriptor on its folder (fsat.bind_unix_at:
        the mode is set before bind, the owner by fchownat without following a
        link), so no moment exists where a user could redirect root's chmod or
        chown; the folder must be root's, not writable by anyone else."""
        folder, name = os.path.split(self.path)
        dfd = fsat.open_dir(folder, create_mode=0o755)
        try:
            owner = (self.broker.user.uid, self.broker.user.gid) if os.geteuid() == 0 else None
            # Owned by the agent's user so that only it (and root) may connect.
            sock = fsat.bind_unix_at(dfd, name, mode=self.mode,
                                     uid=owner[0] if owner else None,
                                     gid=owner[1] if owner else None)
        finally:
            os.close(dfd)
        # The socket's own name is a /proc/self/fd path that means nothing once
        # that descriptor is closed: asyncio must not unlink by it (close() does).
        extra: dict[str, Any] = {"cleanup_socket": False} if sys.version_info >= (3, 13) else {}
        try:
            # Each connection is a descriptor charged to the agent's user
            # (fdshare), over all her agents and the daemon's other sockets.
            serve = fdshare.charged(self.broker.user.uid, 1, self._serve, _refused_share)
            self._server = await asyncio.start_unix_server(serve, sock=sock,
                                                           limit=READ_CHUNK, **extra)
        except BaseException:
            sock.close()
            raise

    def withdraw(self) -> None:
        """Take the socket's name away: new connects fail (ENOENT: the client
        waits and retries, see cli/tool.py) while connections the kernel
        already queued are still accepted and answered before close()."""
        with contextlib.suppress(OSError):
            fsat.unlink_path(self.path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(OSError):
            fsat.unlink_path(self.path)

    def _check(self, peer: Peer) -> None:
        agent = self.lookup(peer.cgroup)
        if agent != self.broker.agent_id:
            raise AccessDenied(
                f"pid {peer.pid} in cgroup {peer.cgroup} is not agent {self.broker.agent_id}"
            )
        if peer.uid != self.broker.user.uid:
            raise AccessDenied(f"pid {peer.pid} runs as uid {peer.uid}, not the agent's user")

    def _admit(self) -> None:
        """Count a new connection, or refuse it by name: per agent below its
        limit, and over all agents below half the daemon's file limit."""
        global _open_connections
        limit = min(self.broker.limits.max_connections, descriptor_budget())
        if self._connections >= limit:
            raise too_large("max_connections", limit, "too many connections to the broker")
        if _open_connections >= descriptor_budget():
            raise too_large("max_connections", descriptor_budget(),
                            "the daemon holds as many broker connections as it may")
        self._connections += 1
        _open_connections += 1

    def _release(self) -> None:
        global _open_connections
        self._connections -= 1
        _open_connections -= 1

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self._admit()
        except LimitExceeded as exc:
            with contextlib.suppress(Exception):
                await _send(writer, limit_error(exc))
                writer.close()
                await writer.wait_closed()
            return
        try:
            await self._serve_admitted(reader, writer)
        finally:
            self._release()

    async def _serve_admitted(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        sock = writer.get_extra_info("socket")
        try:
            try:
                peer = identify(sock)
                self._check(peer)
            except AccessDenied as exc:
                self.broker.audit(
                    AuditRecord(
                        agent=self.broker.agent_id, user=self.broker.user.name,
                        uid=self.broker.user.uid, tool="-", target="-", taint="-",
                        clearance="-", rule="peer-identity", outcome="deny", detail=str(exc),
                    )
                )
                await _send(writer, {"ok": False, "error": {"code": "identity",
                                                            "message": str(exc)}})
                return
            self.broker.scope_cgroup = peer.cgroup
            self.broker.caller_pid = peer.pid
            uid = self.broker.user.uid
            lines = Lines(reader, pace=lambda n: parseshare.pace(uid, n))
            while True:
                # The last request's buffers are freed by now (heap.py: a flood
                # of mid-size ones fragments the heap, and only a trim gives
                # the holes back).
                heap.trim_soon()
                limits = self.broker.limits
                try:
                    line = await lines.next(limits.request_max_bytes)
                except TooLong:
                    await _send(writer, limit_error(too_large(
                        "request_max_bytes", limits.request_max_bytes,
                        "the request line is longer")))
                    continue
                if line is None:
                    return
                try:
                    self.broker.enter()
                except LimitExceeded as exc:
                    await _send(writer, limit_error(exc))
                    continue
                try:
                    reply = await self._handle(line)
                    await _send(writer, reply)
                finally:
                    self.broker.leave()
        except ConnectionError:
            return
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _handle(self, line: bytes) -> dict[str, Any]:
        # Off the event loop, yet the daemon's process: paced by the user's
        # share as it was read (Lines).
        try:
            depth = self.broker.limits.json_max_depth
            # Off the event loop: a megabyte of brackets is the agent's CPU time.
            # A short line (a read_file's is ~70 bytes) is parsed here: at most
            # ~50 µs for the worst 512 bytes, against a pool hop's ~70 µs of
            # a 4 KiB read_file's ~600 (bench/gate_bench.py, loaded 2 cores).
            req = (parse_request(line, depth) if len(line) <= SHORT_LINE
                   else await self.broker.in_pool(parse_request, line, depth))
        except LimitExceeded as exc:
            return limit_error(exc)
        except ValueError as exc:
            return {"ok": False, "error": {"code": "invalid",
                                           "message": f"bad request: {str(exc)[:200]}"}}
        rid = req.get("id")
        if not (rid is None or isinstance(rid, int) or (isinstance(rid, str) and len(rid) <= 64)):
            rid = None  # echoed back, so bounded; the client will see no id
        try:
            reply = await self._dispatch(req)
        except Exception as exc:  # the daemon never fails because of one request
            self.broker.audit(
                AuditRecord(
                    agent=self.broker.agent_id, user=self.broker.user.name,
                    uid=self.broker.user.uid, tool=str(req.get("tool", "-"))[:64], target="-",
                    taint="-", clearance="-", rule="internal-error", outcome="error",
                    detail=f"{type(exc).__name__}: {str(exc)[:200]}",
                )
            )
            reply = {"ok": False, "error": {"code": "failed",
                                            "message": "internal error in the broker"}}
        if rid is not None:
            reply["id"] = rid
        return reply

    async def _dispatch(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op", "call")
        if op == "call":
            args = req.get("args") or {}
            if not isinstance(args, dict) or not isinstance(req.get("tool"), str):
                reply = {"ok": False, "error": {"code": "invalid",
                                                "message": "call needs tool (str), args (object)"}}
            else:
                reply = await self.broker.call(TOOLS.canonical(req["tool"]), args)
        elif op == "evict":
            ids = req.get("ids")
            if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                reply = {"ok": False, "error": {"code": "invalid", "message": "ids: list of int"}}
            else:
                reply = self.broker.evict(ids)
        elif op == "ledger":
            reply = self.broker.ledger_view()
        elif op == "tools":
            reply = self.broker.tool_list()
        else:
            shown_op = str(op)[:40]
            reply = {"ok": False, "error": {"code": "invalid",
                                            "message": f"unknown op {shown_op!r}"}}
        return reply


def encode_reply(reply: dict[str, Any]) -> list[bytes]:
    """The reply line in parts; a result already encoded (file content, by
    the worker) is spliced in as is rather than decoded and encoded again."""
    result = reply.get("result")
    if isinstance(result, RawJSON):
        rest = {k: v for k, v in reply.items() if k != "result"}
        head = json.dumps(rest, ensure_ascii=False).encode()
        return [head[:-1], b', "result": ', *result.parts, b"}\n"]
    return [json.dumps(reply, ensure_ascii=False).encode() + b"\n"]


async def _refused_share(writer: asyncio.StreamWriter) -> None:
    await _send(writer, limit_error(too_large(
        "max_connections", fdshare.user_share(),
        "this user's agents hold as many of the daemon's descriptors as they may")))


async def _send(writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
    writer.writelines(encode_reply(obj))
    await writer.drain()
