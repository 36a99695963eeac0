"""The agent's hands: a small process running as the agent's user, inside
the agent's own scope, that opens files and does the heavy part of the file
tools (reading and encoding content, listing, editing) on the broker's
behalf. Descriptors travel over a unix socket (SCM_RIGHTS).

Why a process and not setfsuid/setfsgid around each open: the filesystem
uid is per thread, but the supplementary groups are not settable per thread
through libc (glibc broadcasts setgroups to every thread of the daemon), and
a forgotten restore on an error path would leave a daemon thread acting as
the wrong user. A separate process that dropped to the user's uid, gid and
groups once, before it ever saw a request, cannot get that wrong.

Why in the agent's scope: what a call costs grows with what the agent asks
(a 1 MiB file, a 500 MiB edit). The process is moved into the cgroup of
the agent process that called, before its first request, so that cost
counts against the agent's MemoryMax and TasksMax and it is the agent that
runs out, not the daemon (root, outside every agent's limits). The daemon
only decides and relays replies bounded by the budget it sets per request.

In the agent's view (issue 43): given `fence`, a pidfd on PID 1 of the
agent's running fence, the worker enters that mount namespace before its
first request (opener_worker.enter), so the file tools act on what the
agent's fence shows, by construction: what the fence binds read-only
(protected git files, a read-only workdir) or hides is read-only or absent
to them too, and a throwaway workdir's writes land in its layer. The
namespace is entered once per worker, never per call; a worker whose PID 1
has ended (a new stage's fence) is `stale` and replaced by the broker.

It takes no decision: every descriptor it opens comes back to the broker,
which decides on the real path of that descriptor (readlink
/proc/self/fd/N) before handing it back for reading or editing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import posixpath
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

from leviathd import reaping
from leviathd.broker import opener_worker as wire
from leviathd.errors import Unavailable
from leviathd.sandbox.privileges import KEYCTL_SYSCALL, join_new_session_keyring

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "opener_worker.py")
# A worker stopped or stuck (the agent's user can SIGSTOP it, a file can sit
# on a hung mount) costs one call this long, not a daemon thread forever.
TIMEOUT = 60.0


class OpenFailed(OSError):
    """The worker's open failed. `where`: the real path where it failed (None
    when the worker could not say), for the broker to decide whether the
    agent may learn the error."""

    def __init__(self, err: int, path: str, where: str | None) -> None:
        super().__init__(err, os.strerror(err), path)
        self.where = where


def _procs_files(cgroup: str, mountinfo: str) -> list[str]:
    """The cgroup.procs file of `cgroup` in every mounted hierarchy; where a
    hierarchy lacks that exact folder (a container's cgroup made in some v1
    controllers only), of its nearest ancestor up to the agent's scope."""
    from leviathd.systemd.cgroupfs import folders

    chain = [cgroup]
    while not posixpath.basename(chain[-1]).startswith("leviath-") and chain[-1] != "/":
        chain.append(posixpath.dirname(chain[-1]))
    if chain[-1] == "/":
        chain = [cgroup]  # no scope above it: only the exact folder will do
    per_level = [folders(c, mountinfo) for c in chain]
    out: list[str] = []
    for i in range(len(per_level[0])):
        for level in per_level:
            if len(level) == len(per_level[0]) and os.path.isdir(level[i]):
                out.append(posixpath.join(level[i], "cgroup.procs"))
                break
    return out


def _attach(pid: int, cgroup: str) -> None:
    """Move `pid` into `cgroup` (a path as /proc/<pid>/cgroup gives it) in
    every mounted hierarchy, as the shell tool does."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        files = _procs_files(cgroup, f.read())
    if not files:
        raise Unavailable(f"the control group {cgroup} is not mounted here")
    for path in files:
        with open(path, "w", encoding="ascii") as f:
            f.write(str(pid))


class Opener:
    """Client side, used by the broker (thread-safe; one request at a time)."""

    def __init__(
        self, *, uid: int, gid: int, groups: Sequence[int], cgroup: str | None = None,
        max_data: int = 1 << 20, fence: int | None = None,
    ) -> None:
        """`fence`: a pidfd on PID 1 of the agent's fence, now the Opener's
        (closed with it): the worker opens inside its mount namespace."""
        self._fence = fence
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        kwargs: dict[str, object] = {}
        argv = [sys.executable, "-I", "-S", _WORKER, str(child.fileno()), str(max_data + 4096)]
        keep = [child.fileno()]
        if fence is not None:
            if os.geteuid() != 0:
                parent.close()
                child.close()
                os.close(fence)
                raise Unavailable("the broker must run as root to enter an agent's mounts")
            # Started as root: it enters the namespace, then drops to the
            # user itself (entering needs root's rights, opener_worker.enter).
            argv.append(json.dumps({"join": fence, "uid": uid, "gid": gid,
                                    "groups": list(groups), "keyctl": KEYCTL_SYSCALL}))
            keep.append(fence)
        elif os.geteuid() == 0:
            # The keyring is joined after subprocess's switch to the user, so
            # it is hers: nothing of the daemon's session keyring stays in
            # reach of a process running with her uid.
            kwargs = {"user": uid, "group": gid, "extra_groups": list(groups),
                      "preexec_fn": join_new_session_keyring}
        elif uid != os.geteuid():
            raise Unavailable("the broker must run as root to act for another user")
        # What the broker sends at most (edit texts); the worker refuses more.
        self.max_data = max_data
        try:
            self._proc: subprocess.Popen[bytes] = subprocess.Popen(
                # Run as a plain script under -I -S: nothing from the user's
                # environment or site-packages is imported into a process that
                # holds the user's credentials and talks to root.
                argv,
                pass_fds=keep,
                stdin=subprocess.DEVNULL,
                env={"PATH": "/usr/bin:/bin"},
                cwd="/",
                **kwargs,  # type: ignore[call-overload]
            )
        except BaseException:
            parent.close()
            child.close()
            if fence is not None:
                os.close(fence)
            raise
        child.close()
        self._sock = parent
        self._sock.settimeout(TIMEOUT)
        # The same socket for the event loop's round trips (open_read_async):
        # without a timeout, its calls never wait; readiness is the loop's.
        self._nb = socket.socket(fileno=os.dup(parent.fileno()))
        self._nb.setblocking(False)
        self._lock = threading.Lock()
        # Whether a round trip is awaited on the loop, and whether close()
        # came meanwhile: that round trip closes `_nb` when it ends, after
        # its reader is removed (closed earlier, the number could be reused
        # by another socket, whose reader that removal would take away).
        self._state = threading.Lock()
        self._on_loop = False
        self._closed = False
        if cgroup is not None and os.geteuid() == 0:
            try:
                _attach(self._proc.pid, cgroup)
            except (OSError, Unavailable) as exc:
                self.close()
                raise Unavailable(f"cannot run the file tools in the agent's scope: {exc}"
                                  ) from None

    def _request(
        self, header: dict[str, Any], *, data: bytes = b"", fds: Sequence[int] = (),
        max_reply: int = 0,
    ) -> tuple[dict[str, Any], bytes, list[int]]:
        with self._lock:
            try:
                wire.send(self._sock, header, data, list(fds))
                reply, out, got = wire.recv(self._sock, max_reply)
            except (OSError, EOFError, ValueError) as exc:
                # Timed out, died, or sent more than asked: it is not trusted
                # with another request.
                self._kill()
                why = str(exc) or "it exited (out of the agent's memory?)"
                raise Unavailable(f"the file worker process failed: {why}") from None
        return reply, out, got

    def open(
        self, path: str, flags: int, mode: int = 0o644, *, dir_fd: int | None = None,
        follow: bool = True,
    ) -> int:
        """Open `path` as the agent's user; returns a descriptor owned by the
        caller. Raises OpenFailed with the errno the user's open got."""
        return self._open(path, flags, mode, dir_fd=dir_fd, follow=follow)[0]

    def open_read(
        self, path: str, flags: int, max_bytes: int, budget: int
    ) -> tuple[int, tuple[bytes, bool] | None]:
        """`open`, and for a regular file its content as `read` would give it,
        in the same round trip. The content is only to be used once the
        descriptor is accepted; None when the worker did not read."""
        fd, reply, out = self._open(path, flags, 0, read={"max_bytes": max_bytes,
                                                        "budget": budget}, max_reply=budget)
        ahead = reply.get("read")
        if not isinstance(ahead, dict) or not ahead.get("ok") or not ahead.get("fits"):
            return fd, None
        return fd, (out, bool(ahead.get("truncated")))

    async def open_read_async(
        self, path: str, flags: int, max_bytes: int, budget: int
    ) -> tuple[int, tuple[bytes, bool] | None] | None:
        """`open_read` from the event loop, with no thread in between: the
        request is sent and the reply awaited without blocking (the loop waits
        for the worker's socket to be readable, at most TIMEOUT). None when
        the worker is busy with a pool thread's request: the caller takes the
        blocking path. A worker that fails, times out or whose round trip is
        abandoned (the caller cancelled) is killed, as in `_request`: a late
        reply must never be taken for the next request's."""
        if not self._lock.acquire(blocking=False):
            return None
        with self._state:
            if self._closed:
                self._lock.release()
                raise Unavailable("the file worker was closed")
            self._on_loop = True
        header: dict[str, Any] = {"op": "open", "path": path, "flags": flags, "mode": 0,
                                  "follow": True,
                                  "read": {"max_bytes": max_bytes, "budget": budget}}
        try:
            try:
                reply, out, got = await self._exchange(header, budget)
            except (OSError, EOFError, ValueError) as exc:
                self._kill()
                why = str(exc) or "it exited (out of the agent's memory?)"
                raise Unavailable(f"the file worker process failed: {why}") from None
            except BaseException:
                self._kill()
                raise
        finally:
            with self._state:
                self._on_loop = False
                closed = self._closed
            if closed:
                self._nb.close()
            self._lock.release()
        fd, reply, out = self._opened(path, reply, out, got)
        ahead = reply.get("read")
        if not isinstance(ahead, dict) or not ahead.get("ok") or not ahead.get("fits"):
            return fd, None
        return fd, (out, bool(ahead.get("truncated")))

    async def _exchange(
        self, header: dict[str, Any], max_reply: int
    ) -> tuple[dict[str, Any], bytes, list[int]]:
        """wire.send and wire.recv on the non-blocking socket, each wait at
        most TIMEOUT. The request is one small packet into an empty queue
        (one request at a time, and the worker read the last one before it
        replied): a full queue is a failure, not a wait."""
        wire.send(self._nb, header)
        loop = asyncio.get_running_loop()
        while True:
            try:
                raw, fds, _flags, _addr = socket.recv_fds(self._nb, wire.MAX_HEADER, 2)
                break
            except BlockingIOError:
                await self._readable(loop)
        try:
            if not raw:
                raise EOFError
            reply, size, inline = wire.split(raw, max_reply)
            parts: list[bytes] = [inline]
            got = len(inline)
            while got < size:
                try:
                    part = self._nb.recv(wire.CHUNK)
                except BlockingIOError:
                    await self._readable(loop)
                    continue
                if not part:
                    raise EOFError
                parts.append(part)
                got += len(part)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return reply, b"".join(parts), fds

    async def _readable(self, loop: asyncio.AbstractEventLoop) -> None:
        """Until the worker's socket can be read; TimeoutError after TIMEOUT
        (a worker its user stopped, a file on a hung mount)."""
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        def late() -> None:
            if not ready.done():
                ready.set_exception(TimeoutError("no reply in time"))

        fd = self._nb.fileno()
        loop.add_reader(fd, wake)
        timer = loop.call_later(TIMEOUT, late)
        try:
            await ready
        finally:
            timer.cancel()
            loop.remove_reader(fd)

    def _open(
        self, path: str, flags: int, mode: int, *, dir_fd: int | None = None,
        follow: bool = True, read: dict[str, int] | None = None, max_reply: int = 0,
    ) -> tuple[int, dict[str, Any], bytes]:
        header: dict[str, Any] = {"op": "open", "path": path, "flags": flags, "mode": mode,
                                  "follow": follow}
        if read is not None:
            header["read"] = read
        reply, out, got = self._request(
            header, fds=[dir_fd] if dir_fd is not None else [], max_reply=max_reply
        )
        return self._opened(path, reply, out, got)

    def _opened(
        self, path: str, reply: dict[str, Any], out: bytes, got: list[int]
    ) -> tuple[int, dict[str, Any], bytes]:
        """An open's reply: the one descriptor it sent, or OpenFailed."""
        if not reply.get("ok"):
            for fd in got:
                os.close(fd)
            where = reply.get("where")
            raise OpenFailed(int(reply.get("errno", 5)), path,
                             where if isinstance(where, str) else None)
        if len(got) != 1:
            for fd in got:
                os.close(fd)
            raise Unavailable("the file worker sent no descriptor")
        return got[0], reply, out

    def read(self, fd: int, max_bytes: int, budget: int) -> tuple[bytes, bool] | None:
        """The file's first `max_bytes` as a JSON string literal of at most
        `budget` bytes, and whether it was cut; None if not even an empty cut fits."""
        reply, out, got = self._request(
            {"op": "read", "max_bytes": max_bytes, "budget": budget}, fds=[fd],
            max_reply=budget,
        )
        for extra in got:
            os.close(extra)
        if not reply.get("ok"):
            err = int(reply.get("errno", 5))
            raise OSError(err, os.strerror(err))
        if not reply.get("fits"):
            return None
        return out, bool(reply.get("truncated"))

    def list(self, fd: int, budget: int) -> tuple[bytes, bool]:
        """The folder's entries as a JSON array of at most `budget` bytes."""
        reply, out, got = self._request({"op": "list", "budget": budget}, fds=[fd],
                                        max_reply=budget)
        for extra in got:
            os.close(extra)
        if not reply.get("ok"):
            err = int(reply.get("errno", 5))
            raise OSError(err, os.strerror(err))
        return out, bool(reply.get("truncated"))

    def edit(self, fd: int, old: str, new: str, replace_all: bool, max_bytes: int
             ) -> dict[str, Any]:
        data = json.dumps({"old": old, "new": new, "all": replace_all},
                          ensure_ascii=False).encode()
        reply, _out, got = self._request({"op": "edit", "max_bytes": max_bytes}, data=data,
                                         fds=[fd])
        for extra in got:
            os.close(extra)
        if "errno" in reply:
            err = int(reply["errno"])
            raise OSError(err, os.strerror(err))
        return reply

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def fenced(self) -> bool:
        """It opens in an agent's mount namespace."""
        return self._fence is not None

    def stale(self) -> bool:
        """The fence it entered has ended (its PID 1 exited: the agent moved
        to another step, or is ending): its view is no longer the agent's."""
        if self._fence is None:
            return False
        poller = select.poll()
        poller.register(self._fence, select.POLLIN)
        return bool(poller.poll(0))

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(signal.SIGKILL)

    def close(self) -> None:
        """The worker is done: killed (it holds nothing of value) and reaped
        once gone, never waited for here. This runs on the daemon's loop,
        and a worker held in the kernel (its user's FUSE server not
        answering the close of a file it opened, which not even SIGKILL
        ends) held the loop, and every user, with it (before: a wait of up
        to 5 s, then one without end)."""
        with self._state:
            self._closed = True
            waited = self._on_loop
        self._sock.close()
        if not waited:
            self._nb.close()
        if self._fence is not None:
            os.close(self._fence)
            self._fence = None
        self._kill()
        reaping.reap_when_gone(self._proc.pid)
