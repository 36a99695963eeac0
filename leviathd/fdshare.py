"""The daemon's descriptors that clients can make it hold, charged to the
uid they act for.

Every socket the daemon serves to agents or users (the broker, the proxy,
the engine socket, the SSH agent) takes from this one ledger when it
accepts a connection and gives back when the connection ends, so that one
user, whatever mix of agents and surfaces she uses, holds at most her
share, and all clients together never take the room the daemon keeps for
its own work (records, journal, systemd, podman, other users' starts).

The budget is a fraction of the daemon's soft RLIMIT_NOFILE, read when
asked (a drop-in that changes LimitNOFILE takes effect at the restart):
clients together at most CLIENT_FRACTION of it, one uid at most 1/SHARES of
that. Each surface's own per-agent caps (broker.limits, proxy
max_connections, ...) still apply inside a user's share.

`refuse_fds` is the receive for a protocol that reads with recvmsg and
expects no descriptors: whatever SCM_RIGHTS brought is closed at once (a
plain recv() lets the kernel drop them, which is what the asyncio streams
do).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import resource
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from leviathd import fdclose

# Clients together: three quarters of the soft limit; the last quarter is
# the daemon's own (its bus connection, records, journal, systemd, engine
# calls, the pipes of attached agents' output).
CLIENT_NUM, CLIENT_DEN = 3, 4
# One uid: an eighth of the clients' part, so that it takes eight users at
# their full share to fill it.
SHARES = 8
# Descriptors one message may carry on Linux (SCM_MAX_FD).
SCM_MAX_FD = 253


def soft_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return int(soft)


def clients_total(soft: int | None = None) -> int:
    return max(SHARES, (soft or soft_limit()) * CLIENT_NUM // CLIENT_DEN)


def user_share(soft: int | None = None) -> int:
    return max(1, clients_total(soft) // SHARES)


class Ledger:
    """Descriptors held for clients, by uid. Single-threaded: the event
    loop's."""

    def __init__(self) -> None:
        self.by_uid: Counter[int] = Counter()
        self.total = 0

    def take(self, uid: int, n: int = 1) -> bool:
        """Charge n to uid; False (nothing charged) past its share or the
        clients' total."""
        if self.by_uid[uid] + n > user_share() or self.total + n > clients_total():
            if self.by_uid[uid] <= 0:
                del self.by_uid[uid]
            return False
        self.by_uid[uid] += n
        self.total += n
        return True

    def give(self, uid: int, n: int = 1) -> None:
        self.by_uid[uid] -= n
        self.total -= n
        if self.by_uid[uid] <= 0:
            del self.by_uid[uid]

    def held(self, uid: int) -> int:
        return self.by_uid.get(uid, 0)


LEDGER = Ledger()

StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                         Coroutine[Any, Any, None]]


def charged(uid: int, n: int, serve: StreamHandler,
            refused: Callable[[asyncio.StreamWriter], Awaitable[None]] | None = None,
            ) -> StreamHandler:
    """An asyncio.start_unix_server handler that charges each connection n
    descriptors to uid while `serve` runs; past the share the connection
    is closed at once (after `refused(writer)`, which may say why)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not LEDGER.take(uid, n):
            try:
                if refused is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(refused(writer), 1.0)
            finally:
                writer.close()
            return
        try:
            await serve(reader, writer)
        finally:
            LEDGER.give(uid, n)
            writer.close()

    return handler


def close_rights(ancillary: list[tuple[int, int, bytes]], keep: int | None = None) -> int:
    """Close every descriptor SCM_RIGHTS brought in `ancillary` (recvmsg's)
    but `keep` (the one the protocol expects); how many were closed."""
    closed = 0
    for level, kind, data in ancillary:
        if level != socket.SOL_SOCKET or kind != socket.SCM_RIGHTS:
            continue
        fds = array.array("i")
        fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        for fd in fds:
            if fd == keep:
                keep = None
                continue
            # Off the loop: a FUSE file's close waits on its server (fdclose.py).
            fdclose.discard(fd)
            closed += 1
    return closed


def refuse_fds(sock: socket.socket, bufsize: int) -> bytes:
    """recv() for a protocol that expects no descriptors, on a socket read
    with recvmsg: room for the most one message can carry, each closed at
    once (a short buffer would leave the kernel to drop them too; this does
    not depend on that)."""
    data, ancillary, _flags, _addr = sock.recvmsg(
        bufsize, socket.CMSG_SPACE(SCM_MAX_FD * array.array("i").itemsize))
    close_rights(ancillary)
    return data
