"""An agent's proxy closing must leave nothing of its listeners in the
daemon's event loop. Its listeners wait in loop.sock_accept; closing one
while that wait was only cancelled (asyncio removes the registration a loop
turn later) left the loop's map holding the closed descriptor's number.
The next descriptor the daemon opened under that number (CI4's case: the
pidfd that watches another agent's PID 1) was then registered in the map
alone, never in epoll: its end was never heard, the agent stayed
"running" for ever and its attached caller waited with it."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

from leviathd.domain.sensitivity import Sensitivity
from leviathd.proxy.policy import ProxySettings
from leviathd.proxy.server import Agent, ProxyServer


def _agent() -> Agent:
    return Agent(id="0123abcd", user="u", uid=os.getuid(), gid=os.getgid(),
                 taint=lambda: Sensitivity.PUBLIC, approvals=lambda: None,
                 is_own=lambda _cg: True)


async def _accepting(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """Until the acceptor waits in the loop on `fd`."""
    for _ in range(200):
        try:
            loop._selector.get_key(fd)  # type: ignore[attr-defined]
            return
        except KeyError:
            await asyncio.sleep(0.01)
    raise AssertionError(f"the proxy never waited on its listener {fd}")


async def _heard(loop: asyncio.AbstractEventLoop, want: int) -> bool:
    """A readable descriptor opened under number `want` (the one just
    closed), as a pidfd whose process ended is: does the loop call its
    reader?"""
    held: list[int] = []
    try:
        while True:  # the lowest free numbers first, as the kernel gives them
            held.append(os.eventfd(1))  # readable: its count is 1
            if held[-1] == want:
                break
            assert len(held) < 64, "the closed number never came back"
        fut: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not fut.done():
                fut.set_result(None)

        loop.add_reader(want, readable)
        try:
            await asyncio.wait_for(fut, 5)
            return True
        except TimeoutError:
            return False
        finally:
            loop.remove_reader(want)
    finally:
        for fd in held:
            os.close(fd)


def test_a_descriptor_reusing_a_closed_listeners_number_is_heard(tmp_path: Path) -> None:
    async def main() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        proxy = ProxyServer(_agent(), ProxySettings(), str(tmp_path / "proxy.sock"),
                            lambda _r: None)
        await proxy.start()
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(8)
        proxy.adopt(tcp)
        tcp_fd = tcp.fileno()
        await _accepting(loop, tcp_fd)
        await proxy.close()
        # No turn of the loop in between: the daemon opens its next
        # descriptor (a pidfd, a pipe) as soon as close() returns.
        first = await _heard(loop, tcp_fd)
        # And the unix listener, closed the same way.
        proxy2 = ProxyServer(_agent(), ProxySettings(), str(tmp_path / "proxy2.sock"),
                             lambda _r: None)
        await proxy2.start()
        assert proxy2._listener is not None
        unix_fd = proxy2._listener.fileno()
        await _accepting(loop, unix_fd)
        await proxy2.close()
        second = await _heard(loop, unix_fd)
        return first, second

    assert asyncio.run(main()) == (True, True)
