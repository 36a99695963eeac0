"""The descriptor ledger (leviathd/fdshare.py) and the receives that close
what a client sent, with real sockets and the process's own descriptor
table as the judge."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from leviathd import fdclose, fdshare
from leviathd.proxy import server


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_uid_gets_its_share_and_no_more_and_others_keep_theirs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fdshare, "soft_limit", lambda: 1024)
    ledger = fdshare.Ledger()
    share = fdshare.user_share()
    assert share == 1024 * 3 // 4 // 8
    assert all(ledger.take(1000) for _ in range(share))
    assert not ledger.take(1000)
    assert ledger.take(1001, 6)
    ledger.give(1000, share)
    assert ledger.held(1000) == 0 and 1000 not in ledger.by_uid
    assert ledger.take(1000)


def test_all_uids_together_stop_at_the_clients_total(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fdshare, "soft_limit", lambda: 1024)
    ledger = fdshare.Ledger()
    uid = 2000
    while ledger.take(uid, fdshare.user_share()):
        uid += 1
    assert ledger.total <= fdshare.clients_total() < 1024
    assert not ledger.take(uid + 1)


def test_refuse_fds_closes_every_descriptor_that_came() -> None:
    a, b = socket.socketpair()
    null = os.open("/dev/null", os.O_RDONLY)
    try:
        before = _open_fds()
        for _ in range(20):
            socket.send_fds(a, [b"x"], [null] * 200)
            assert fdshare.refuse_fds(b, 16) == b"x"
        # Closed off the caller's thread (fdclose.py), at once.
        assert fdclose.wait_closed()
        assert _open_fds() == before
    finally:
        os.close(null)
        a.close()
        b.close()


@pytest.mark.parametrize("first", [b"\0", b"G"])
def test_the_proxy_handshake_keeps_none_of_a_clients_non_socket_descriptors(
    first: bytes,
) -> None:
    """Seen failing before the fix: socket.socket(fileno=) of /dev/null
    raised and the number stayed open in the daemon, one a connection."""

    async def run() -> None:
        null = os.open("/dev/null", os.O_RDONLY)
        try:
            before = _open_fds()
            for _ in range(50):
                a, b = socket.socketpair()
                b.setblocking(False)
                socket.send_fds(a, [first], [null] * 8)
                try:
                    await server._handed(b)
                except ValueError:
                    pass
                a.close()
                b.close()
            assert fdclose.wait_closed()
            assert _open_fds() == before
        finally:
            os.close(null)

    asyncio.run(run())


def test_the_proxy_handshake_takes_a_handed_tcp_socket_and_nothing_more() -> None:
    async def run() -> None:
        null = os.open("/dev/null", os.O_RDONLY)
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        a, b = socket.socketpair()
        try:
            b.setblocking(False)
            before = _open_fds()
            socket.send_fds(a, [b"\0"], [tcp.fileno(), null, null])
            first, got = await server._handed(b)
            assert first == b"" and got.family == socket.AF_INET
            assert fdclose.wait_closed()
            assert _open_fds() == before + 1  # the TCP socket, and only it
            got.close()
        finally:
            for s in (a, b, tcp):
                s.close()
            os.close(null)

    asyncio.run(run())


def test_a_charged_handler_closes_a_connection_past_the_share_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fdshare, "soft_limit", lambda: 64)
    monkeypatch.setattr(fdshare, "LEDGER", fdshare.Ledger())
    share = fdshare.user_share()
    served: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(1)
        await reader.read(1)

    async def run() -> None:
        handler = fdshare.charged(1000, 1, serve)
        pairs = [socket.socketpair() for _ in range(share + 3)]
        tasks = []
        for _a, b in pairs:
            reader, writer = await asyncio.open_connection(sock=b)
            tasks.append(asyncio.create_task(handler(reader, writer)))
        while len(served) + sum(t.done() for t in tasks) < len(tasks):
            await asyncio.sleep(0)
        assert len(served) == share and sum(t.done() for t in tasks) == 3
        assert fdshare.LEDGER.held(1000) == share
        for a, _b in pairs:
            a.close()
        await asyncio.gather(*tasks)
        assert fdshare.LEDGER.held(1000) == 0

    asyncio.run(run())
