"""A write path for dbus-fast that survives a full socket.

dbus-fast (2.44 in Debian 13 through 5.2 on PyPI, python-dbus-next #153 upstream)
writes a new message at once when its queue is empty, even while an earlier,
large message is still half-sent; the socket is then full, `send` raises
BlockingIOError (EAGAIN) and the library takes that for a dead connection: it
drops the bus and the daemon with it. Seen with a 1-2 MB `List` reply and
small replies queued behind it, and with a flood of calls from one client.

EAGAIN only means "not now": this write loop keeps the rest of the message and
waits for the socket to become writable again. Everything else stays the
library's (queueing, futures, its reaction to real errors). The writer class
lives in `dbus_fast.aio.message_bus`, which is pure Python in every version we
support; `install()` refuses loudly if that ever changes, rather than running
with the defect.
"""

from __future__ import annotations

import array
import logging
import socket
from typing import Any

from dbus_fast.aio import message_bus as _aio

log = logging.getLogger(__name__)

_RETRY_LATER = (BlockingIOError, InterruptedError)


def _write_callback(self: Any, remove_writer: bool = True) -> None:
    sock = self.sock
    try:
        while True:
            if self.buf is None:
                if not self.messages:
                    if remove_writer:
                        self.loop.remove_writer(self.fd)
                    return
                data, unix_fds, fut = self.messages.popleft()
                self.buf = memoryview(data)
                self.unix_fds = unix_fds
                self.offset = 0
                self.fut = fut
            try:
                if self.unix_fds and self.negotiate_unix_fd:
                    # The descriptors travel with the first byte that gets out;
                    # on EAGAIN nothing did, so they are sent with the retry.
                    fds = array.array("i", self.unix_fds)
                    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)]
                    self.offset += sock.sendmsg([self.buf[self.offset:]], rights)
                    self.unix_fds = None
                else:
                    self.offset += sock.send(self.buf[self.offset:])
            except _RETRY_LATER:
                # Called by the loop, the writer stays registered; called by
                # schedule_write, that registers it next since buf is kept.
                return
            if self.offset < len(self.buf):
                return
            self.buf = None
            if self.fut is not None and not self.fut.done():
                self.fut.set_result(None)
    except Exception as exc:
        fut = self.fut
        if fut is not None and not fut.done():
            if self.bus._user_disconnect:
                fut.set_result(None)
            else:
                fut.set_exception(exc)
        self.bus._finalize(exc)


_REQUIRED = ("write_callback", "schedule_write", "buffer_message")


def install() -> None:
    """Replace the library's write loop (process-wide, idempotent)."""
    writer = getattr(_aio, "_MessageWriter", None)
    if writer is None or not all(hasattr(writer, name) for name in _REQUIRED):
        raise RuntimeError(
            "dbus_fast.aio.message_bus._MessageWriter is not the one leviathd knows; "
            "refusing to run with the EAGAIN defect (see leviathd/bus/writer.py)"
        )
    writer.write_callback = _write_callback


def installed() -> bool:
    writer = getattr(_aio, "_MessageWriter", None)
    return getattr(writer, "write_callback", None) is _write_callback
