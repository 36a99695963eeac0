"""Whether the checks on an opened file may run on the event loop.

The broker decides a read on the descriptor the file worker opened: its
real path (readlink of /proc/self/fd/N, answered from the kernel's dentry
cache), its `fstat` (type, link count) and the label kept in a `trusted.*`
attribute. On a FUSE file system the last two are questions to its server,
which the agent's user may run and never answer: asked on the event loop,
they would hold every agent's broker. So they run there only for a file on a
file system backed by a block device the user cannot serve, told from the
device number alone.

The device number is read with statx(AT_STATX_DONT_SYNC): a network or FUSE
file system answers it from the attributes it has cached, without a request
(fs/fuse/dir.c, fuse_update_get_attr; NFS likewise, fs/nfs/inode.c). Other
network file systems (CIFS, 9p, Ceph) were not checked for that flag: one
that ignores it could make this one statx wait on its server, which only
root can have mounted. Anonymous devices (major 0: FUSE,
NFS, tmpfs, overlayfs, btrfs, proc) are refused, and so are the block
devices a user may have attached to a file of hers, served by anything (loop,
nbd, device-mapper, whose targets are not looked at here). `fuseblk` (FUSE
on a block device) is mounted by root only (fusermount refuses `blkdev` to
others). What is left (a disk, a partition, virtio, NVMe, md) answers fstat
from the inode the open loaded, and an extended attribute at most with one
read of that device.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

_AT_EMPTY_PATH = 0x1000
_AT_STATX_DONT_SYNC = 0x4000
_STATX_TYPE = 0x1
# struct statx (linux/stat.h): 256 bytes; stx_dev_major at 136.
_STATX_SIZE = 256
_DEV_MAJOR = 136
# Block drivers (as /proc/devices names them) that a user can have backed by
# a file or a server of her own: loop (udisks attaches one to her file),
# nbd, ublk (served from user space), device-mapper (its targets may sit on
# either), and blkext (partitions of any of them).
_UNTRUSTED = frozenset({"loop", "nbd", "ublk", "ublkb", "device-mapper", "blkext"})

_statx: Any = None
try:
    _statx = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).statx
except (OSError, AttributeError):  # pragma: no cover (glibc < 2.28: never on the loop)
    _statx = None
# Block majors and their drivers, read from /proc/devices when a major is
# met that is not in it yet (drivers load at any time; a number is not
# reused by another driver while the first holds it, and a mounted file
# system holds its device's).
_drivers: dict[int, str] = {}


def device_major(fd: int) -> int | None:
    """The major device number of the file system `fd` is on, read without
    a request to that file system's server; None when it cannot be read."""
    if _statx is None:
        return None
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    if _statx(fd, b"", _AT_EMPTY_PATH | _AT_STATX_DONT_SYNC, _STATX_TYPE, buf) != 0:
        return None
    return int.from_bytes(buf.raw[_DEV_MAJOR:_DEV_MAJOR + 4], "little")


def block_drivers() -> dict[int, str]:
    out: dict[int, str] = {}
    with open("/proc/devices", encoding="ascii") as f:
        block = False
        for line in f:
            if line.startswith("Block devices:"):
                block = True
                continue
            parts = line.split()
            if block and len(parts) == 2 and parts[0].isdigit():
                out[int(parts[0])] = parts[1]
    return out


def local(fd: int) -> bool:
    """fstat and fgetxattr of `fd` never wait on a server the agent's user
    may run: they may be asked on the event loop."""
    major = device_major(fd)
    if not major:
        return False  # unknown, or an anonymous device (FUSE, NFS, tmpfs, overlayfs)
    if major not in _drivers:
        try:
            _drivers.update(block_drivers())
        except (OSError, ValueError):
            return False
    driver = _drivers.get(major)
    return driver is not None and driver not in _UNTRUSTED
