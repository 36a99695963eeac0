"""Reaping a child of the daemon's without waiting for it on the loop: a
child held in the kernel (a FUSE server that never answers its close, which
not even SIGKILL ends) would hold every user's requests with it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading

from leviathd import loopfd


def reap_when_gone(pid: int) -> None:
    """Reap our child `pid` now if it has exited, else once it has (its
    pidfd turns readable, on the running loop; without one, in a thread of
    its own). A held child may still be on its way out (it tells the daemon
    PID 1's pid, then exits) when a short agent's output is already copied,
    and a WNOHANG alone would leave its zombie for good."""
    try:
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            return
    except ChildProcessError:
        return  # not ours, or reaped already
    try:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(pid)
    except (RuntimeError, OSError):
        # No loop (the daemon's shutdown, a worker thread) or no pidfd now.
        threading.Thread(target=_wait, args=(pid,), name=f"leviath-reap-{pid}",
                         daemon=True).start()
        return

    def ended() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)

    loopfd.add_fresh_reader(loop, pidfd, ended)


def _wait(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
