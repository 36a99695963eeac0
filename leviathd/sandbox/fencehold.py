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
import errno
import os
import socket
import struct
from collections.abc import Awaitable, Callable

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


def waiter(fd: int) -> Callable[[], None]:
    """The fence's end (in its PID 1, mounts built): say so, wait for the
    daemon's answer. No answer (the daemon failed to mark, or is gone)
    raises, and the fence fails."""
    def ready() -> None:
        # The kernel attaches this process's pid (our peer has SO_PASSCRED).
        os.write(fd, b"r")
        answer = os.read(fd, 1)
        os.close(fd)
        if answer != b"g":
            raise OSError(errno.EPERM, "the daemon could not watch the fence's writes")
    return ready


async def serve(sock: socket.socket, mark: Callable[[int], Awaitable[None]]) -> None:
    """The agent's own fences, one per step, each waiting in turn: `mark`
    each, until the supervisor ends. Our end is closed when this returns."""
    try:
        while await release(sock, mark, keep=True):
            pass
    except Exception:
        return
    finally:
        with contextlib.suppress(OSError):
            sock.close()


async def release(sock: socket.socket, mark: Callable[[int], Awaitable[None] | None], *,
                  keep: bool = False) -> bool:
    """Wait for the fence's word, `mark(pid)`, then let it run (True). If
    `mark` raises, or the word carries no pid, the fence is left to fail (our
    end closes unanswered). Returns False at once when the child ends without
    a word (its fence failed before). `keep`: our end stays open after an
    answer, for the next fence."""
    loop = asyncio.get_running_loop()
    answered = False
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
            return False
        pid = _sender(ancillary)
        if pid is None:
            return False
        pending = mark(pid)
        if pending is not None:
            await pending
        sock.send(b"g")
        answered = True
        return True
    except OSError:
        return False
    finally:
        if not (keep and answered):
            with contextlib.suppress(OSError):
                sock.close()
