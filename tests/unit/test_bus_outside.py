"""Answers come from outside the agents (leviathd/bus/outside.py, issue 43
item 4): where a caller runs is read from the kernel, for the process the
bus names, and a process in any agent's slice or scope is refused. The bed
test (tests/integration/test_broker_view.py) calls from a real agent."""

from __future__ import annotations

import asyncio
import os

import pytest
from dbus_fast.aio import MessageBus
from session_bus import bus_address

from leviathd.bus import outside
from leviathd.errors import AccessDenied

__all__ = ["bus_address"]


@pytest.mark.parametrize("text", [
    "0::/leviath.slice/leviath-alice-claude-0a1b2c3d.scope\n",
    "0::/leviath.slice/leviath-alice-claude-0a1b2c3d.scope/engine/conmon\n",
    # A hybrid host: the agent part shows in the name=systemd hierarchy.
    "12:name=systemd:/leviath.slice/leviath-bob-x-0a1b2c3d.scope\n0::/\n",
    "0::/leviath.slice\n",
])
def test_a_process_in_an_agents_slice_or_scope_is_inside(text: str) -> None:
    assert outside.agent_part(text) is not None


@pytest.mark.parametrize("text", [
    "0::/user.slice/user-1001.slice/session-3.scope\n",
    "0::/system.slice/leviathd.service\n",
    # Names that only look alike.
    "0::/user.slice/leviath-notes.service\n",
    "0::/user.slice/my-leviath.slice.d\n",
])
def test_a_process_elsewhere_is_outside(text: str) -> None:
    assert outside.agent_part(text) is None


def test_the_caller_is_looked_up_by_the_process_the_bus_names(bus_address: str) -> None:
    """This test's own process (outside every agent) passes; a name the bus
    no longer knows is refused, never taken for outside."""

    async def go() -> None:
        server = await MessageBus(bus_address=bus_address).connect()
        client = await MessageBus(bus_address=bus_address).connect()
        assert client.unique_name is not None
        pid, pidfd = await outside._credentials(server, client.unique_name)
        os.close(pidfd)
        assert pid == os.getpid()
        await outside.require_outside(server, client.unique_name, "answer")
        name = client.unique_name
        client.disconnect()
        await asyncio.sleep(0.05)
        with pytest.raises(AccessDenied):
            await outside.require_outside(server, name, "answer")
        server.disconnect()

    asyncio.run(go())


def test_a_process_gone_since_is_refused(tmp_path: object) -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    pidfd = os.pidfd_open(pid)
    os.waitpid(pid, 0)
    try:
        with pytest.raises(AccessDenied, match="gone"):
            outside._where(pid, pidfd)
    finally:
        os.close(pidfd)
