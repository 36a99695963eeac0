"""The forwarder: the one way out of a `network = "proxy"` sandbox.

The agent's network namespace has only `lo`, so the daemon's proxy cannot
listen there itself. The namespace launcher, right after it made the new
network namespace (and before the PID namespace, so the agent cannot see or
signal this process), binds 127.0.0.1:PORT as root and forks this relay. The
relay drops to the agent's user (no capabilities, no_new_privs, not dumpable)
and copies bytes between each TCP connection and a fresh connection to the
daemon's per-agent unix socket, by its host path. It understands nothing: the
daemon (leviathd/proxy/server.py) speaks HTTP and SOCKS5, decides, resolves
and connects; it knows which agent is calling from this process's cgroup.

Bounded: at most MAX_CONNECTIONS at once (two threads and two 64 KiB buffers
each); more are closed at once. It dies with the launcher (PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import socket
import threading
from collections.abc import Sequence

PORT = 3128
HOST = "127.0.0.1"
SOCKET_NAME = "proxy.sock"
MAX_CONNECTIONS = 256
CHUNK = 65536

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def listen() -> socket.socket:
    """The listening socket, in the caller's (new) network namespace."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, PORT))
    sock.listen(128)
    return sock


def start(
    sock: socket.socket, unix_path: str, uid: int, gid: int, groups: Sequence[int]
) -> int:
    """Fork the relay; returns its pid. The caller closes its copy of `sock`."""
    pid = os.fork()
    if pid != 0:
        return pid
    code = 0
    try:
        from leviathd.sandbox.privileges import drop_to_user

        drop_to_user(uid, gid, groups, no_new_privs=True)
        # After the credentials change, which clears both.
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        if os.getppid() == 1:
            os._exit(0)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        serve(sock, unix_path)
    except BaseException:
        code = 1
    os._exit(code)


def serve(sock: socket.socket, unix_path: str) -> None:
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
    while True:
        conn, _ = sock.accept()
        if not slots.acquire(blocking=False):
            conn.close()
            continue
        threading.Thread(target=_handle, args=(conn, unix_path, slots), daemon=True).start()


def _handle(conn: socket.socket, unix_path: str, slots: threading.BoundedSemaphore) -> None:
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            up.connect(unix_path)
        except OSError:
            return
        back = threading.Thread(target=_pump, args=(up, conn), daemon=True)
        back.start()
        _pump(conn, up)
        back.join()
    finally:
        up.close()
        conn.close()
        slots.release()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy until end of file, then pass the half-close on."""
    try:
        while data := src.recv(CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
    # The other direction may be stuck writing into a peer that stopped reading.
    with contextlib.suppress(OSError):
        src.shutdown(socket.SHUT_RD)
