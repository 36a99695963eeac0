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

import pytest

from leviathd.broker.opener import Opener

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the worker runs as another user")

NOBODY = 65534


def _exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def test_a_stopped_worker_is_dropped_without_waiting_for_it_and_reaped_later() -> None:
    async def run() -> None:
        opener = Opener(uid=NOBODY, gid=NOBODY, groups=[])
        pid = opener.pid
        os.kill(pid, signal.SIGSTOP)  # what its user can do to it
        opener.close()
        # Back at once: nothing reaped it yet (a zombie, or on its way out).
        assert _exists(pid)
        # The loop reaps it once it is gone: no zombie stays.
        for _ in range(200):
            if not _exists(pid):
                break
            await asyncio.sleep(0.05)
        assert not _exists(pid)

    asyncio.run(run())
