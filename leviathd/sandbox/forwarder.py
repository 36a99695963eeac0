"""The forwarder: the one way out of a `network = "proxy"` sandbox.

The agent's network namespace has only `lo`, so the daemon's proxy cannot
listen there itself. The namespace launcher, right after it made the new
network namespace (and before the PID namespace, so the agent cannot see or
signal this process), binds 127.0.0.1:PORT as root and forks this relay. The
relay drops to the agent's user (no capabilities, no_new_privs, not dumpable)
and hands each TCP connection (its descriptor, SCM_RIGHTS) to the daemon over
a fresh connection to the daemon's per-agent unix socket, by its host path;
the daemon then reads and writes the agent's socket itself, so no byte passes
through this process. It understands nothing: the
daemon (leviathd/proxy/server.py) speaks HTTP and SOCKS5, decides, resolves
and connects; it knows which agent is calling from this process's cgroup.

A container's network namespace is the engine's (`--network none`: only
`lo`), made after the agent's scope: there the daemon runs this module as a
command (`main`), from a shell that first joined the scope's cgroups, with
the container's network namespace as an inherited descriptor. It enters
that namespace, binds, and leaves a relay behind that lives as long as the
scope (systemd ends it with the agent); the container's processes, in their
own PID namespace, cannot see it.

Bounded: it holds one connection at a time, for a moment (at most
HAND_TIMEOUT if the daemon does not take it). It dies with the launcher
(PDEATHSIG), or for a container with the agent's scope.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import NoReturn

PORT = 3128
HOST = "127.0.0.1"
URL = f"http://{HOST}:{PORT}"
NO_PROXY = "localhost,127.0.0.1,::1"


def proxy_env() -> dict[str, str]:
    """The variables that send an agent's clients (and its containers', which
    share its network namespace) to this forwarder, in both cases."""
    env: dict[str, str] = {}
    for name, value in (("HTTP_PROXY", URL), ("HTTPS_PROXY", URL),
                        ("ALL_PROXY", f"socks5h://{HOST}:{PORT}"),
                        ("NO_PROXY", NO_PROXY)):
        env[name] = env[name.lower()] = value
    return env
SOCKET_NAME = "proxy.sock"
# A daemon that does not take a connection within this long loses it.
HAND_TIMEOUT = 5.0

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.syscall.restype = ctypes.c_long


def listen() -> socket.socket:
    """The listening socket, in the caller's (new) network namespace."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, PORT))
    sock.listen(128)
    return sock


# Where a handed-over PID 1 keeps the listening socket (namespace.LISTEN_FD).
PID1_LISTEN_FD = 8
_SYS_PIDFD_GETFD = 438  # the same number on every architecture


def take_listener(pid: int) -> socket.socket | None:
    """A copy of the listening socket the agent's PID 1 keeps (an agent
    without a relay: namespace.start), for the daemon to accept on; None
    when `pid` is not such a PID 1 (1 in a PID namespace of its own,
    holding a listening TCP socket bound to HOST:PORT). Needs
    CAP_SYS_PTRACE: PID 1 is not dumpable."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            nspid = next((ln.split()[1:] for ln in f.read(1 << 14).splitlines()
                          if ln.startswith("NSpid:")), [])
        if len(nspid) < 2 or nspid[-1] != "1":
            return None
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        fd = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, PID1_LISTEN_FD, 0)
    finally:
        os.close(pidfd)
    if fd < 0:
        return None
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        return None
    try:
        if (sock.family == socket.AF_INET and sock.type == socket.SOCK_STREAM
                and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                and sock.getsockname() == (HOST, PORT)):
            return sock
    except OSError:
        pass
    sock.close()
    return None


def start(
    sock: socket.socket, unix_path: str, uid: int, gid: int, groups: Sequence[int]
) -> int:
    """Fork the relay; returns its pid. The caller closes its copy of `sock`."""
    pid = os.fork()
    if pid != 0:
        return pid
    _relay(sock, unix_path, uid, gid, groups, tied=True)


def _relay(sock: socket.socket, unix_path: str, uid: int, gid: int, groups: Sequence[int],
           *, tied: bool) -> NoReturn:
    """In the forked child: become the agent's user and serve; never returns."""
    code = 0
    try:
        from leviathd.sandbox.privileges import drop_to_user

        drop_to_user(uid, gid, groups, no_new_privs=True)
        # After the credentials change, which clears both.
        if tied:
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        if tied and os.getppid() == 1:
            os._exit(0)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        serve(sock, unix_path)
    except BaseException:
        code = 1
    os._exit(code)


def main(argv: Sequence[str]) -> int:
    """`NETNS_FD SOCKET UID GID [GROUP...]` (root, for a container): enter
    the network namespace open at NETNS_FD, bind there and fork the relay,
    which outlives this command. Exit 0 once it listens."""
    try:
        netns, path, uid, gid = int(argv[0]), argv[1], int(argv[2]), int(argv[3])
        groups = [int(g) for g in argv[4:]]
    except (IndexError, ValueError):
        print("usage: forwarder NETNS_FD SOCKET UID GID [GROUP...]", file=sys.stderr)
        return 2
    if _libc.setns(netns, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        print(f"setns: {os.strerror(err)}", file=sys.stderr)
        return 1
    os.close(netns)
    try:
        sock = listen()
    except OSError as exc:
        print(f"listen on {HOST}:{PORT}: {exc}", file=sys.stderr)
        return 1
    if os.fork() == 0:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        _relay(sock, path, uid, gid, groups, tied=False)
    return 0


def serve(sock: socket.socket, unix_path: str) -> None:
    """Hand each accepted connection to the daemon's proxy: one NUL byte
    with the connection's descriptor over a fresh connection to its socket
    (the daemon then reads and writes the agent's socket itself). Nothing is
    kept here: a connection costs the forwarder a moment, not a thread."""
    while True:
        conn, _ = sock.accept()
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.settimeout(HAND_TIMEOUT)
            up.connect(unix_path)
            socket.send_fds(up, [b"\0"], [conn.fileno()])
        except OSError:
            pass
        finally:
            up.close()
            conn.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
