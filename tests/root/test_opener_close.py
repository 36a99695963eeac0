"""The broker drops an agent's file worker (broker/opener.py) on the daemon's
loop when the worker stops answering. The worker runs as the agent's user,
who can stop it (SIGSTOP) or have it held in the kernel (a FUSE server of
hers that never answers its close, which not even SIGKILL ends): dropping
it must never wait for it there. Before, close() waited up to 5 s, killed
it, then waited without end."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from leviathd.broker.opener import Opener

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the worker runs as another user")

NOBODY = 65534


def _exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def test_a_stopped_worker_is_dropped_without_waiting_for_it_and_reaped_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def run() -> bool:
        opener = Opener(uid=NOBODY, gid=NOBODY, groups=[])
        pid = opener.pid
        os.kill(pid, signal.SIGSTOP)  # what its user can do to it
        # A worker SIGKILL cannot end yet (held in the kernel by its user's
        # FUSE server): close()'s own kill does nothing here. Killed, a
        # stopped worker could already be gone, and reaped at once, by the
        # time close() returns, which said nothing of whether it waited.
        monkeypatch.setattr(opener, "_kill", lambda: None)
        # Were close() to wait for it, this would end the wait, and say so.
        rescued = threading.Event()

        def rescue() -> None:
            rescued.set()
            os.kill(pid, signal.SIGKILL)

        watchdog = threading.Timer(30, rescue)
        watchdog.start()
        try:
            opener.close()
        finally:
            watchdog.cancel()
        if rescued.is_set():
            return False
        # Back while the worker lives: nothing waited for it.
        assert _exists(pid)
        os.kill(pid, signal.SIGKILL)
        # The loop reaps it once it is gone: no zombie stays.
        for _ in range(200):
            if not _exists(pid):
                break
            await asyncio.sleep(0.05)
        assert not _exists(pid)
        return True

    assert asyncio.run(run()), "close() waited for the worker (until the watchdog killed it)"
