"""The system calls the namespace fence is built with, as Python calls: libc
through ctypes (mount, umount2, unshare, setns, pivot_root, mount_setattr,
sethostname, prctl) and one ioctl to bring `lo` up. Each failure raises
FenceError naming the call."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import platform
import signal
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]

_SYS_MOUNT_SETATTR = 442  # the same number on every architecture (kernel 5.12)
_AT_SYMLINK_NOFOLLOW = 0x100
_AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]



class FenceError(Exception):
    """A step of building the fence failed; the message says which."""


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise FenceError(f"{what}: {os.strerror(err)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    rc = _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data))
    _check(rc, f"mount {fstype or 'bind'} {source or ''} on {target}")


def umount2(target: str, flags: int) -> None:
    _check(_libc.umount2(_b(target), flags), f"umount {target}")


def setattr_recursive(path: str, attr_set: int) -> bool:
    """Add `attr_set` (MOUNT_ATTR_*) to the mount at `path` and every mount
    beneath it, in one call that changes all or none; the flags they have
    already (noexec, read-only) stay. False on a kernel without
    mount_setattr (before 5.12): the caller remounts one by one."""
    attr = _MountAttr(attr_set, 0, 0, 0)
    rc = _libc.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_long(-100),  # AT_FDCWD
                       _b(path), ctypes.c_uint(_AT_RECURSIVE | _AT_SYMLINK_NOFOLLOW),
                       ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))  # fmt: skip
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.ENOSYS:
        return False
    raise FenceError(f"mount_setattr on {path}: {os.strerror(err)}")


def _mount_setattr_known() -> bool:
    """Whether this kernel has mount_setattr: asked once, in the daemon,
    with arguments it refuses (no path), so nothing changes."""
    rc = _libc.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_long(-1), None,
                       ctypes.c_uint(0), None, ctypes.c_size_t(0))  # fmt: skip
    return rc == 0 or ctypes.get_errno() not in (errno.ENOSYS, errno.EPERM)


HAVE_MOUNT_SETATTR = _mount_setattr_known()


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(fd, nstype), "setns")


def pivot_root(new_root: str, put_old: str) -> None:
    nr = _PIVOT_ROOT.get(platform.machine())
    if nr is None:
        raise FenceError(f"pivot_root: unknown architecture {platform.machine()}")
    _check(_libc.syscall(nr, _b(new_root), _b(put_old)), "pivot_root")



def pivot_root_known() -> bool:
    """pivot_root's number is known on this architecture."""
    return platform.machine() in _PIVOT_ROOT


def sethostname(name: str) -> None:
    _check(_libc.sethostname(_b(name), len(name.encode())), "sethostname")


def kill_with_parent() -> None:
    """SIGKILL this process when its parent dies (a change of credentials
    clears it: set it again after one)."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def loopback_up() -> None:
    """Bring `lo` up in the new network namespace.

    A single SIOCSIFFLAGS ioctl rather than pyroute2: importing pyroute2 costs
    about 200 ms on this class of machine, over ten times the whole fence's budget.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, 0x8913, ifreq))[1]  # SIOCGIFFLAGS
        # SIOCSIFFLAGS with IFF_UP added
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH14x", b"lo", flags | 0x1))
    finally:
        sock.close()
