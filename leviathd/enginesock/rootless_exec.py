"""The launcher of an agent's rootless podman API service (run by the daemon
as `python -m leviathd.enginesock.rootless_exec`, as root, already moved into
the agent's scope by the daemon before it reads its orders on stdin).

It makes a private mount namespace with a fresh /proc, becomes the agent's
user for good, and execs `podman system service` with the listening socket
the daemon bound (fd 3) handed over by systemd's socket activation
protocol (LISTEN_FDS/LISTEN_PID): podman never binds, names or sees a path
the agent could reach.

Why a fresh /proc: leviathd.service's ProtectKernelLogs= covers /proc/kmsg
with another mount, and the kernel lets a user namespace mount a new proc
(every rootless container does) only where a fully visible one exists
("mount proc: operation not permitted" from runc, seen in the test bed,
whose /proc/sys is also covered). Root mounts it here, in a namespace only
this service and its children have, before giving up root.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import socket
import struct
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
MS_REC, MS_SLAVE = 0x4000, 0x80000
LISTEN_FD = 3
MAX_ORDERS = 64 * 1024


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def own_namespaces(private_network: bool) -> None:
    """A mount namespace with a fresh /proc; with `private_network` also a
    network namespace of its own with only lo: an agent without the host's
    network gets an engine without it (pulls, builds' RUN steps and every
    container's slirp4netns or pasta reach nothing outside)."""
    libc = ctypes.CDLL(None, use_errno=True)
    # From the machine's mount namespace, not the daemon's: the unit's own is
    # private to it (ProtectSystem= and friends), so mounts the daemon makes
    # for the agent in the machine's (bind sources pinned by descriptor)
    # would never reach an engine that started from the unit's.
    ns = os.open("/proc/1/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(libc.setns(ns, CLONE_NEWNS), "setns(/proc/1/ns/mnt)")
    finally:
        os.close(ns)
    flags = CLONE_NEWNS | (CLONE_NEWNET if private_network else 0)
    _check(libc.unshare(flags), "unshare")
    if private_network:
        loopback_up()
    # Slave, not private: mounts the daemon makes later for the agent in the
    # machine's namespace (bind sources pinned by descriptor) still reach the
    # engine; nothing mounted here goes back.
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None), "mount --make-rslave /")
    _check(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None),
           "mount -t proc proc /proc")


def main() -> int:
    raw = sys.stdin.buffer.readline(MAX_ORDERS)
    if not raw.endswith(b"\n"):
        return 2  # the daemon went away before it gave the orders
    orders = json.loads(raw)
    uid, gid = int(orders["uid"]), int(orders["gid"])
    groups = [int(g) for g in orders["groups"]]
    argv = [str(a) for a in orders["argv"]]
    env = {str(k): str(v) for k, v in orders["env"].items()}
    sock = int(orders["fd"])
    if uid == 0 or gid == 0:
        return 2  # never root's engine: that is what this whole design avoids
    own_namespaces(bool(orders.get("private_network", True)))
    if sock != LISTEN_FD:
        os.dup2(sock, LISTEN_FD)
        os.close(sock)
    os.set_inheritable(LISTEN_FD, True)
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        return 2
    # podman's own messages, written as the user into the user's runtime folder.
    log = os.open(orders["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                  | os.O_CLOEXEC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(orders["cwd"])
    # The protocol names the process that is to take the descriptors: this
    # one, which exec keeps.
    env["LISTEN_FDS"] = "1"
    env["LISTEN_PID"] = str(os.getpid())
    os.execve(argv[0], argv, env)
    return 2  # not reached


if __name__ == "__main__":
    sys.exit(main())
