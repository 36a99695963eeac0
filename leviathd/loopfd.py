"""Registering a descriptor the daemon has just opened with its event loop.

asyncio keeps a map of registered descriptor numbers beside the kernel's
epoll set. A number closed while still in that map (a socket whose
sock_accept was cancelled but not yet unregistered, say) stays there; the
next file opened under the same number is then only re-labelled in the map
by add_reader, never added to epoll, and its readiness is never heard. For
a pidfd that watches an agent's PID 1, that was an agent "running" for ever
and its attached caller waiting with it (CI4 of 2026-12-02).

A number the daemon has just been given by the kernel cannot rightly be in
the map: whatever is there is stale, and is dropped (and said) before the
new registration, which then reaches epoll."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


def add_fresh_reader(loop: asyncio.AbstractEventLoop, fd: int,
                     callback: Callable[..., Any], *args: Any) -> None:
    """loop.add_reader for `fd`, which the caller opened itself and has not
    registered before."""
    stale = loop.remove_reader(fd)
    if loop.remove_writer(fd):
        stale = True
    if stale:
        # A closed file's registration: a bug elsewhere, which this survives.
        log.error("descriptor %d was still registered with the event loop for a file "
                  "closed before; that registration is dropped", fd)
    loop.add_reader(fd, callback, *args)
