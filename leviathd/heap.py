"""Keep large buffers out of glibc's arenas, so the daemon gives them back.

glibc serves a large allocation (128 KiB and up) with its own mapping and
unmaps it when freed, but the first such free raises that threshold to the
freed size (up to 32 MiB). From then on the megabyte strings of one agent's
file contents or parsed requests come from the arenas, and what is freed at
the top of each thread's arena is never returned: not even `malloc_trim`
hands back a thread arena's top. An agent's flood of large calls left the
daemon ~1 MiB bigger per broker thread for good (+4.5 to +10 MB in the bed).
Fixing the threshold turns the raising off; the price is one mmap/munmap
pair per large buffer, small beside copying a megabyte.
"""

from __future__ import annotations

import ctypes

_M_MMAP_THRESHOLD = -3  # <malloc.h>
_THRESHOLD = 128 * 1024  # glibc's own starting value


def return_large_buffers() -> bool:
    """Fix glibc's mmap threshold for this process (False: not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False  # musl and others have no such knob (nor the raising)
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _THRESHOLD))
