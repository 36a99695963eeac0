"""The agent's hands: a small process running as the agent's user that opens
files on the broker's behalf and passes the open descriptors back over a
unix socket (SCM_RIGHTS).

Why a process and not setfsuid/setfsgid around each open: the filesystem
uid is per thread, but the supplementary groups are not settable per thread
through libc (glibc broadcasts setgroups to every thread of the daemon), and
a forgotten restore on an error path would leave a daemon thread acting as
the wrong user. A separate process that dropped to the user's uid, gid and
groups once, before it ever saw a request, cannot get that wrong, and it is
started once per agent, not per call. It only opens; every policy decision
is taken by the broker on the real path of the descriptor it gets back
(readlink /proc/self/fd/N), so the opener needs no policy and a symlink or a
rename race can change what was opened but not what is allowed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence

from leviathd.errors import Unavailable
from leviathd.sandbox.privileges import join_new_session_keyring

_MAX_MSG = 65536
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "opener_worker.py")


class Opener:
    """Client side, used by the broker (thread-safe; one request at a time)."""

    def __init__(self, *, uid: int, gid: int, groups: Sequence[int]) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        kwargs: dict[str, object] = {}
        if os.geteuid() == 0:
            # The keyring is joined after subprocess's switch to the user, so
            # it is hers: nothing of the daemon's session keyring stays in
            # reach of a process running with her uid.
            kwargs = {"user": uid, "group": gid, "extra_groups": list(groups),
                      "preexec_fn": join_new_session_keyring}
        elif uid != os.geteuid():
            raise Unavailable("the broker must run as root to act for another user")
        env = {"PATH": "/usr/bin:/bin"}
        self._proc: subprocess.Popen[bytes] = subprocess.Popen(
            # Run as a plain script under -I -S: nothing from the user's
            # environment or site-packages is imported into a process that
            # holds the user's credentials and talks to root.
            [sys.executable, "-I", "-S", _WORKER, str(child.fileno())],
            pass_fds=[child.fileno()],
            stdin=subprocess.DEVNULL,
            env=env,
            cwd="/",
            **kwargs,  # type: ignore[call-overload]
        )
        child.close()
        self._sock = parent
        self._lock = threading.Lock()

    def open(self, path: str, flags: int, mode: int = 0o644, *, dir_fd: int | None = None) -> int:
        """Open `path` as the agent's user; returns a descriptor owned by the
        caller. Raises OSError with the errno the user's open got."""
        message = json.dumps({"path": path, "flags": flags, "mode": mode}).encode()
        fds = [dir_fd] if dir_fd is not None else []
        with self._lock:
            try:
                socket.send_fds(self._sock, [message], fds)
                data, got, _, _ = socket.recv_fds(self._sock, _MAX_MSG, 1)
            except OSError as exc:
                raise Unavailable(f"the file opener process is gone: {exc}") from None
        if not data:
            raise Unavailable("the file opener process has exited")
        reply = json.loads(data)
        if not reply.get("ok"):
            for fd in got:
                os.close(fd)
            err = int(reply.get("errno", 5))
            raise OSError(err, os.strerror(err), path)
        if len(got) != 1:
            raise Unavailable("the file opener sent no descriptor")
        return got[0]

    @property
    def pid(self) -> int:
        return self._proc.pid

    def close(self) -> None:
        self._sock.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
