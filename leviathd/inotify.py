"""The few inotify(7) calls the daemon needs, through libc (the standard
library has no binding, and the inotify-simple package is in no Debian
release): a non-blocking instance, a watch on a folder, and its events.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

IN_MODIFY = 0x2
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_DONT_FOLLOW = 0x2000000

IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# struct inotify_event: wd, mask, cookie, len, then `len` bytes of name.
_EVENT = struct.Struct("=iIII")
# One read: events are at most 16 + NAME_MAX + 1 bytes each.
_READ = 64 * 1024

# The process's own symbols (libc is loaded already): no `ldconfig -p` fork.
_libc = ctypes.CDLL(None, use_errno=True)
_init1 = _libc.inotify_init1
_init1.argtypes = [ctypes.c_int]
_init1.restype = ctypes.c_int
_add_watch = _libc.inotify_add_watch
_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_add_watch.restype = ctypes.c_int


@dataclass(frozen=True)
class Event:
    wd: int
    mask: int
    cookie: int
    name: str


def _check(ret: int) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def init() -> int:
    """A new inotify instance: a non-blocking, close-on-exec descriptor."""
    return _check(_init1(IN_NONBLOCK | IN_CLOEXEC))


def add_watch(fd: int, path: str, mask: int) -> int:
    return _check(_add_watch(fd, os.fsencode(path), mask))


def parse(data: bytes) -> Iterator[Event]:
    """The events in one read's bytes (a truncated tail is dropped)."""
    offset = 0
    while offset + _EVENT.size <= len(data):
        wd, mask, cookie, length = _EVENT.unpack_from(data, offset)
        start = offset + _EVENT.size
        raw = data[start:start + length]
        offset = start + length
        yield Event(wd, mask, cookie, os.fsdecode(raw.split(b"\0", 1)[0]))


def read(fd: int) -> list[Event]:
    """What is queued now ([] when nothing is: the descriptor is non-blocking)."""
    try:
        data = os.read(fd, _READ)
    except BlockingIOError:
        return []
    return list(parse(data))
