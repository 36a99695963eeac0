"""The few fanotify(7) calls the daemon needs, through libc (Python has no
binding): a notification group, mount marks, and reading its events.

Only notification classes are used (FAN_CLASS_NOTIF): the daemon is told
about writes after the fact and never holds an agent's system call. Each
event read carries an open descriptor on the file (or FAN_NOFD): the caller
owns it and must close it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from dataclasses import dataclass

FAN_CLOEXEC = 0x1
FAN_NONBLOCK = 0x2
FAN_CLASS_NOTIF = 0x0

FAN_MARK_ADD = 0x1
FAN_MARK_REMOVE = 0x2
FAN_MARK_MOUNT = 0x10
FAN_MARK_FLUSH = 0x80

FAN_MODIFY = 0x2
FAN_CLOSE_WRITE = 0x8
FAN_OPEN = 0x20
FAN_Q_OVERFLOW = 0x4000

FAN_NOFD = -1
METADATA_VERSION = 3
# struct fanotify_event_metadata: event_len, vers, reserved, metadata_len,
# mask, fd, pid.
_META = struct.Struct("=IBBHQii")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_init = _libc.fanotify_init
_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
_init.restype = ctypes.c_int
_mark = _libc.fanotify_mark
_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
_mark.restype = ctypes.c_int


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def init() -> int:
    """A new notification group (root only), non-blocking, close-on-exec,
    with the kernel's bounded queue: past it the group gets FAN_Q_OVERFLOW
    instead of more memory. Event descriptors are opened read-only."""
    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_LARGEFILE", 0) | os.O_NOATIME
    return _check(_init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK, flags), "fanotify_init")


def mark_mount(group: int, fd: int, mask: int) -> None:
    """Mark the mount that the open descriptor `fd` lies on (never a path)."""
    _check(_mark(group, FAN_MARK_ADD | FAN_MARK_MOUNT, mask, fd, None), "fanotify_mark")


def flush_mounts(group: int) -> None:
    _check(_mark(group, FAN_MARK_FLUSH | FAN_MARK_MOUNT, 0, -1, None), "fanotify_mark flush")


@dataclass(frozen=True)
class Event:
    mask: int
    fd: int
    pid: int


def read(group: int, max_events: int) -> list[Event]:
    """At most `max_events` queued events ([] when none). Each event's fd is
    the caller's to close; a short or foreign-version record ends the batch
    (its descriptor, if any, is closed here)."""
    try:
        buf = os.read(group, max_events * _META.size)
    except BlockingIOError:
        return []
    out: list[Event] = []
    off = 0
    while off + _META.size <= len(buf):
        length, vers, _r, _mlen, mask, fd, pid = _META.unpack_from(buf, off)
        if vers != METADATA_VERSION or length < _META.size:
            if fd >= 0:
                os.close(fd)
            break
        out.append(Event(mask, fd, pid))
        off += length
    return out
