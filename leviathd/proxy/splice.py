"""Relaying bytes between two sockets with splice(2) through a pipe per
direction: the data stays in the kernel (no copy into Python objects, no
64 KiB reads), which is what makes the proxy's throughput close to a direct
connection's.

`relay()` runs in the daemon's event loop (non-blocking sockets, readiness
callbacks, backpressure: a direction reads again only once its pipe is
empty).

Memory: at most PIPE_BYTES in each pipe, so a connection whose peer stops
reading holds at most two pipes' worth in the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import socket

PIPE_BYTES = 256 << 10
# Pipe-fulls moved per readiness callback before the loop's next turn.
ROUNDS = 16
_F_SETPIPE_SZ = 1031
_MOVE = getattr(os, "SPLICE_F_MOVE", 1)
_NONBLOCK = getattr(os, "SPLICE_F_NONBLOCK", 2)


def _pipe() -> tuple[int, int]:
    r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    with contextlib.suppress(OSError):
        fcntl.fcntl(w, _F_SETPIPE_SZ, PIPE_BYTES)
    return r, w


class _Direction:
    """src -> pipe -> dst, driven by the loop's readiness callbacks."""

    def __init__(self, loop: asyncio.AbstractEventLoop, src: socket.socket,
                 dst: socket.socket, done: asyncio.Future[None], on_bytes: list[int],
                 index: int) -> None:
        self.loop, self.done = loop, done
        self.src, self.dst, self.dst_sock = src.fileno(), dst.fileno(), dst
        self.r, self.w = _pipe()
        self.held = 0  # bytes in the pipe not yet written to dst
        self.eof = False
        self.finished = False
        self.counts, self.index = on_bytes, index

    def start(self) -> None:
        self.loop.add_reader(self.src, self._readable)

    def _readable(self) -> None:
        # While the pipe empties into dst at once, go on reading without a
        # trip back through the selector, at most ROUNDS times a turn (the
        # selector is level-triggered: the rest comes next turn).
        for _ in range(ROUNDS):
            try:
                n = os.splice(self.src, self.w, PIPE_BYTES, flags=_MOVE | _NONBLOCK)
            except BlockingIOError:
                return
            except OSError as exc:
                self._fail(exc)
                return
            if n == 0:
                self.eof = True
                self.loop.remove_reader(self.src)
                if self._drain():
                    self._end()
                else:
                    self.loop.add_writer(self.dst, self._writable)
                return
            self.held += n
            if not self._drain():
                # dst is full: nothing more is read until it took the pipe.
                self.loop.remove_reader(self.src)
                self.loop.add_writer(self.dst, self._writable)
                return

    def _drain(self) -> bool:
        """Empty the pipe into dst; False if dst would block first."""
        while self.held:
            try:
                m = os.splice(self.r, self.dst, self.held, flags=_MOVE | _NONBLOCK)
            except BlockingIOError:
                return False
            except OSError as exc:
                self._fail(exc)
                return False
            self.held -= m
            self.counts[self.index] += m
        return not self.finished

    def _writable(self) -> None:
        if not self._drain():
            return
        self.loop.remove_writer(self.dst)
        if self.eof:
            self._end()
        else:
            self.loop.add_reader(self.src, self._readable)

    def _end(self) -> None:
        with contextlib.suppress(OSError):
            self.dst_sock.shutdown(socket.SHUT_WR)
        self._finish()

    def _fail(self, exc: OSError) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
        self._finish()

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        self.loop.remove_reader(self.src)
        self.loop.remove_writer(self.dst)
        os.close(self.r)
        os.close(self.w)
        if not self.done.done():
            self.done.set_result(None)


async def relay(a: socket.socket, b: socket.socket, counts: list[int]) -> None:
    """Copy a -> b and b -> a until both ends closed (counts[0] += bytes a->b,
    counts[1] += bytes b->a, as they pass). A reset or other error on either
    side ends both directions. The sockets stay the caller's to close."""
    loop = asyncio.get_running_loop()
    a.setblocking(False)
    b.setblocking(False)
    first: asyncio.Future[None] = loop.create_future()
    second: asyncio.Future[None] = loop.create_future()
    ab = _Direction(loop, a, b, first, counts, 0)
    ba = _Direction(loop, b, a, second, counts, 1)
    try:
        ab.start()
        ba.start()
        await asyncio.gather(first, second)
    except OSError as exc:
        if exc.errno not in (errno.ECONNRESET, errno.EPIPE, errno.ETIMEDOUT,
                             errno.ECONNABORTED):
            raise
    finally:
        ab._finish()
        ba._finish()
        for fut in (first, second):
            if fut.done() and not fut.cancelled():
                fut.exception()  # retrieved: no "never retrieved" warning

