"""proxy/splice.py relay: every byte through in both directions, counted, and
one side's end passed on to the other (its peer sees EOF; the relay ends once
both have ended). Real sockets, the real event loop."""

from __future__ import annotations

import asyncio
import socket

from leviathd.proxy import splice


async def _read_to_eof(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes:
    got = b""
    while chunk := await loop.sock_recv(sock, 1 << 16):
        got += chunk
    return got


async def _session() -> None:
    loop = asyncio.get_running_loop()
    agent, a = socket.socketpair()
    b, host = socket.socketpair()
    for s in (agent, host):
        s.setblocking(False)
    counts = [0, 0]
    relay = asyncio.ensure_future(splice.relay(a, b, counts))
    up = bytes(range(256)) * 4096  # 1 MiB: several pipe-fulls
    down = b"answer" * 1000
    try:
        async def send() -> None:
            await loop.sock_sendall(agent, up)
            agent.shutdown(socket.SHUT_WR)
        # The host sees all of it and then the agent's end, bounded (read
        # while sending: the relay's buffers are far smaller than `up`).
        _sent, got = await asyncio.wait_for(
            asyncio.gather(send(), _read_to_eof(loop, host)), 20)
        assert got == up
        await loop.sock_sendall(host, down)
        host.shutdown(socket.SHUT_WR)
        assert await asyncio.wait_for(_read_to_eof(loop, agent), 20) == down
        await asyncio.wait_for(relay, 20)
        assert counts == [len(up), len(down)]
    finally:
        relay.cancel()
        for s in (agent, a, b, host):
            s.close()


def test_bytes_go_through_whole_and_each_end_reaches_the_other_side() -> None:
    asyncio.run(_session())
