"""bus/writer.py: a full socket is "not now", never a dead bus.

The writer under test is dbus-fast's own _MessageWriter with leviathd's write
loop installed, on a real socketpair filled past its buffer; only the bus it
reports to is a stand-in (it records _finalize, the call that drops the bus).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from dbus_fast.aio import message_bus as _aio

from leviathd.bus import writer


@pytest.fixture
def pair() -> Iterator[tuple[Any, socket.socket, asyncio.AbstractEventLoop]]:
    writer.install()
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.setblocking(False)
    loop = asyncio.new_event_loop()
    dropped: list[BaseException] = []
    bus = SimpleNamespace(_negotiate_unix_fd=False, _sock=ours, _loop=loop, _fd=ours.fileno(),
                          _user_disconnect=False, _finalize=dropped.append, dropped=dropped)
    try:
        yield _aio._MessageWriter(bus), peer, loop
    finally:
        loop.close()
        ours.close()
        peer.close()


def _drain(peer: socket.socket) -> bytes:
    got = b""
    while True:
        try:
            chunk = peer.recv(1 << 20)
        except BlockingIOError:
            return got
        got += chunk


def test_a_message_larger_than_the_socket_waits_and_arrives_whole(
    pair: tuple[Any, socket.socket, asyncio.AbstractEventLoop],
) -> None:
    w, peer, loop = pair
    data = bytes(range(256)) * (16 * 1024)  # 4 MiB: far past a socketpair's buffer
    fut = loop.create_future()
    w.messages.append((bytearray(data), None, fut))
    w.write_callback()  # fills the socket (a short send)
    w.write_callback()  # the socket is full: EAGAIN
    # EAGAIN: the rest is kept, the bus is not dropped, the call not failed.
    assert w.bus.dropped == []
    assert w.buf is not None and 0 < w.offset < len(data)
    assert not fut.done()
    got = b""
    for _ in range(10_000):
        got += _drain(peer)
        w.write_callback()
        if fut.done():
            break
    got += _drain(peer)
    assert w.bus.dropped == []
    assert fut.done() and fut.exception() is None
    assert got == data
