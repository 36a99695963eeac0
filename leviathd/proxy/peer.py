"""Who is at the other end of a TCP connection on the host's loopback, from
the kernel (issue 30, `network = true` agents).

A unix socket names its peer (SO_PEERCRED); a TCP socket does not. But the
peer of a loopback connection is a socket of this network namespace, and
the kernel's socket diagnostics (NETLINK_SOCK_DIAG, what `ss` uses) look it
up by its four addresses: its owner's uid and the cgroup (v2) its creator
was in when it was made (INET_DIAG_CGROUP_ID, Linux 5.8+). The cgroup id is
the cgroup directory's inode number; it is turned back into a path with
open_by_handle_at on the cgroup2 mount (a kernfs file handle is that id),
so the caller decides with the same cgroup path check as for a unix peer.

Nothing here trusts a byte the peer sent. A lookup that does not find the
socket (the peer closed, another namespace) is an answer of None.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
INET_DIAG_CGROUP_ID = 21
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
FILEID_KERNFS = 0xFE
_AT_FDCWD = -100

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class _Handle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                ("f_handle", ctypes.c_ubyte * 8)]


@dataclass(frozen=True)
class TcpPeer:
    uid: int
    cgroup_id: int


def _sockid(local: tuple[str, int], remote: tuple[str, int], family: int) -> bytes:
    def addr(ip: str) -> bytes:
        raw = ipaddress.ip_address(ip).packed
        return raw + b"\0" * (16 - len(raw))

    # inet_diag_sockid: sport, dport (big endian), src[16], dst[16], if, cookie[2].
    del family
    return (struct.pack("!HH", local[1], remote[1]) + addr(local[0]) + addr(remote[0])
            + struct.pack("=III", 0, INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE))


def lookup(conn: socket.socket) -> TcpPeer | None:
    """The socket at the other end of `conn` (an accepted TCP connection in
    this network namespace): its owner's uid and its cgroup id."""
    try:
        ours = conn.getsockname()[:2]
        theirs = conn.getpeername()[:2]
    except OSError:
        return None
    family = conn.family
    # The peer's socket: its source is our peer address, its destination us.
    req = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF) + _sockid(
        theirs, ours, family)
    msg = struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + req
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC,
                       NETLINK_SOCK_DIAG)
    try:
        nl.settimeout(1.0)
        nl.sendto(msg, (0, 0))
        data = nl.recv(65536)
    except OSError:
        return None
    finally:
        nl.close()
    return _parse(data, theirs, ours)


def _parse(data: bytes, theirs: tuple[str, int], ours: tuple[str, int]) -> TcpPeer | None:
    if len(data) < 16:
        return None
    length, kind = struct.unpack_from("=IH", data, 0)
    if kind != SOCK_DIAG_BY_FAMILY or length > len(data) or length < 16 + 72:
        return None
    body = data[16:length]
    # inet_diag_msg: family, state, timer, retrans, sockid (48), expires,
    # rqueue, wqueue, uid, inode.
    sport, dport = struct.unpack_from("!HH", body, 4)
    if (sport, dport) != (theirs[1], ours[1]):
        return None  # not the socket asked about: decide nothing on it
    uid = struct.unpack_from("=I", body, 64)[0]
    cgroup: int | None = None
    pos = 72
    while pos + 4 <= len(body):
        alen, atype = struct.unpack_from("=HH", body, pos)
        if alen < 4:
            break
        if atype == INET_DIAG_CGROUP_ID and alen >= 12:
            cgroup = struct.unpack_from("=Q", body, pos + 4)[0]
        pos += (alen + 3) & ~3
    if cgroup is None:
        return None  # an older kernel: no cgroup, no answer
    return TcpPeer(uid=uid, cgroup_id=cgroup)


def cgroup2_mount() -> str | None:
    """Where the unified hierarchy is mounted (/sys/fs/cgroup, or
    /sys/fs/cgroup/unified on a hybrid host)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split(" - ", 1)
                if len(fields) == 2 and fields[1].split(" ", 1)[0] == "cgroup2":
                    return fields[0].split(" ")[4].replace("\\040", " ")
    except OSError:
        pass
    return None


def cgroup_path(cgroup_id: int, mount: str | None = None) -> str | None:
    """The path (from the hierarchy's root, as /proc/PID/cgroup writes it)
    of the cgroup with this id, or None when there is none. Needs
    CAP_DAC_READ_SEARCH (open_by_handle_at)."""
    mount = mount or cgroup2_mount()
    if mount is None:
        return None
    try:
        mfd = os.open(mount, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        handle = _Handle(8, FILEID_KERNFS)
        ctypes.memmove(handle.f_handle, struct.pack("=Q", cgroup_id), 8)
        fd = _libc.open_by_handle_at(mfd, ctypes.byref(handle),
                                     os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        if fd < 0:
            return None
        try:
            if os.fstat(fd).st_ino != cgroup_id:
                return None
            path = os.readlink(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
    finally:
        os.close(mfd)
    root = mount.rstrip("/")
    if path == root:
        return "/"
    if not path.startswith(root + "/"):
        return None
    return path[len(root):]
