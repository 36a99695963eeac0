"""Root acting with a user's file-system ids: opens, reads and mounts made in
folders the user can write are then checked with the user's rights, so a link
planted on the way reaches only what the user could reach anyway."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ctypes


@functools.cache
def _libc() -> ctypes.CDLL:
    # Loaded at the first switch, not at import (lev's start-up), from the
    # process's own symbols: find_library runs `ldconfig -p`, a fork, which in
    # a fence being built would take a pid of the agent's namespace (issue 18).
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.setfsuid.argtypes = [ctypes.c_uint]
    libc.setfsgid.argtypes = [ctypes.c_uint]
    return libc


@contextlib.contextmanager
def as_user(uid: int, gid: int) -> Iterator[None]:
    """This thread's file-system ids are uid/gid inside the block (when root;
    otherwise the calls are checked as the caller already). fsuid is per
    thread: the block must not yield to other work on the same thread."""
    if os.geteuid() != 0:
        yield
        return
    libc = _libc()
    old_gid = libc.setfsgid(gid)
    old_uid = libc.setfsuid(uid)
    try:
        yield
    finally:
        libc.setfsuid(old_uid)
        libc.setfsgid(old_gid)


def preload() -> None:
    """Load libc now: the fence's modules call this at import, in the daemon,
    so that no forked child of it (a fence being built) runs the loader,
    whose lock another thread may have held at the fork."""
    _libc()
