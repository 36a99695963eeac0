"""The daemon's end of the `shell` tool's hold (gate/shell.py): the fence's
PID 1 waits, its mounts built and nothing of the command run, until the
daemon has marked those mounts for the agent's write watch
(broker/writewatch.py). Otherwise the command's writes, in a mount
namespace made after the watch looked at the agent's scope, would go
unseen, and an agent holding Private data could have the shell tool write
it into the workdir unlabelled.

The pid comes from the kernel (SO_PASSCRED on our end: the credentials of
the process that wrote, as this namespace sees it), not from the message.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable

_UCRED = struct.Struct("iII")


def pair() -> tuple[socket.socket, socket.socket]:
    """(ours, the child's): the child's end is passed to gate/shell.py and
    closed here once it is started."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    ours.setblocking(False)
    return ours, theirs


def _sender(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and \
                len(data) >= _UCRED.size:
            pid, _uid, _gid = _UCRED.unpack_from(data)
            return pid if pid > 0 else None
    return None


async def release(sock: socket.socket, mark: Callable[[int], None]) -> None:
    """Wait for the fence's word, `mark(pid)`, then let it run. If `mark`
    raises, or the word carries no pid, the fence is left to fail (our end
    closes unanswered). Returns at once when the child ends without a word
    (its fence failed before)."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                data, ancillary, _flags, _addr = sock.recvmsg(
                    1, socket.CMSG_SPACE(_UCRED.size))
                break
            except BlockingIOError:
                readable: asyncio.Future[None] = loop.create_future()

                def woken(fut: asyncio.Future[None] = readable) -> None:
                    if not fut.done():
                        fut.set_result(None)

                loop.add_reader(sock, woken)
                try:
                    await readable
                finally:
                    loop.remove_reader(sock)
        if data != b"r":
            return
        pid = _sender(ancillary)
        if pid is None:
            return
        mark(pid)
        sock.send(b"g")
    except OSError:
        return
    finally:
        with contextlib.suppress(OSError):
            sock.close()
