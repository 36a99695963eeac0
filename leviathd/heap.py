"""Keep the daemon's heap from holding what it has freed.

glibc serves a large allocation (128 KiB and up) with its own mapping and
unmaps it when freed, but the first such free raises that threshold to the
freed size (up to 32 MiB). From then on the megabyte strings of one agent's
file contents or parsed requests come from the arenas, and what is freed at
the top of each thread's arena is never returned: not even `malloc_trim`
hands back a thread arena's top. An agent's flood of large calls left the
daemon ~1 MiB bigger per broker thread for good (+4.5 to +10 MB in the bed).
Fixing the threshold turns the raising off; the price is one mmap/munmap
pair per large buffer, small beside copying a megabyte.

Buffers under the threshold still come from the arenas, and a flood of
them fragments the heap: calls of 60-120 KB leave free pieces just under
60 KB that no later call fits in, split by small allocations that live on,
so each round of such calls grew the heap by ~0.5 MB, nearly all of it
free (glibc's own count: in use +10 KB a round, free +0.5 MB). One arena
for all threads (the GIL serialises most allocations anyway) and a
`malloc_trim` shortly after broker calls, which gives the free pages inside
the heap back, keep the daemon near the memory it uses.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
from collections.abc import Callable

_M_MMAP_THRESHOLD = -3  # <malloc.h>
_M_ARENA_MAX = -8
_THRESHOLD = 128 * 1024  # glibc's own starting value


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (AttributeError, OSError):
        return None  # musl and others: no such knobs (nor the raising)
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return libc


def return_large_buffers() -> bool:
    """Fix glibc's mmap threshold and use one arena for this process (False:
    not glibc). Called before any thread starts, so no other arena exists."""
    libc = _libc()
    if libc is None:
        return False
    # Each thread's own arena kept its top (~1 MiB) and its holes apart from
    # the rest; in one arena the holes are shared and malloc_trim reaches them.
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _THRESHOLD)) and bool(
        libc.mallopt(_M_ARENA_MAX, 1))


def _malloc_trim() -> None:
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


class Trimmer:
    """Runs `trim` on the event loop `quiet` seconds after the last `soon()`,
    and during a steady stream of them at most every `every` seconds: a
    trim costs well under a millisecond here, so never per call."""

    def __init__(self, trim: Callable[[], None], *, quiet: float = 1.0,
                 every: float = 5.0) -> None:
        self._trim = trim
        self.quiet = quiet
        self.every = every
        self._last = 0.0
        self._done = float("-inf")
        self._handle: asyncio.TimerHandle | None = None

    def soon(self) -> None:
        loop = asyncio.get_running_loop()
        self._last = loop.time()
        if self._handle is None:
            self._handle = loop.call_later(self.quiet, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        if now - self._last < self.quiet and now - self._done < self.every:
            self._handle = loop.call_at(min(self._last + self.quiet, self._done + self.every),
                                        self._fire, loop)
            return
        self._handle = None
        self._done = now
        self._trim()


_trimmer = Trimmer(_malloc_trim)


def trim_soon() -> None:
    """After work that may have freed buffers (a broker call): the free
    pages inside the heap go back to the system a moment later."""
    _trimmer.soon()
