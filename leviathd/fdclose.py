"""Closing descriptors a client sent, off the daemon's loop.

Every close of a file on a FUSE mount sends the file system's server a
FLUSH and waits for its answer, uninterruptibly. Any local user can mount
one (Debian's /dev/fuse is 0666 and fusermount3 set-uid) and attach a file
of it to a bus call, or an agent to a message on its sockets (its workdir
is bound with what the user mounted there): a close on the loop would
then stop the daemon for everyone until that server answered.

So what a client sent is closed in a closer thread. A close still held
after PATIENCE seconds is ended: a FUSE mount's connection is aborted
through fusectl (root's right over any FUSE mount; the kernel fails the
held request and every later one on that mount, which was its user's own
doing), and if that cannot be done another closer takes over the queue
(the held one is left; at most MAX_CLOSERS exist)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import struct
import threading
import time
from collections.abc import Iterable, Iterator

log = logging.getLogger(__name__)

PATIENCE = 2.0
MAX_CLOSERS = 16
FUSECTL = "/sys/fs/fuse/connections"


class _Closers:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._lock = threading.Lock()
        # closer thread id (or minus a thread's id in `watched`) -> (the
        # FUSE connection of what it closes, or None; when it began), while
        # it closes something.
        self._busy: dict[int, tuple[str | None, float]] = {}
        self._threads = 0
        self._idle = 0
        # The held calls (their key and start) whose connection was aborted
        # once: a device number comes back with a later mount.
        self._aborted: set[tuple[int, float]] = set()
        self._watching = False
        # Descriptors given and not closed yet.
        self._pending = 0
        self._settled = threading.Condition(self._lock)

    def put(self, fd: int) -> None:
        with self._lock:
            self._pending += 1
        self._queue.put(fd)
        with self._lock:
            if self._idle == 0 and self._threads == 0:
                self._start_closer()
            self._start_watch()

    def _start_watch(self) -> None:
        """With the lock held."""
        if not self._watching:
            self._watching = True
            threading.Thread(target=self._watch, name="leviath-fdclose-watch",
                             daemon=True).start()

    @contextlib.contextmanager
    def watched(self, conn: str) -> Iterator[None]:
        """Blocking calls on a file of FUSE connection `conn` in this thread,
        cut off (the connection aborted) when held past PATIENCE."""
        key = -threading.get_ident()  # apart from the closers' own entries
        with self._lock:
            self._busy[key] = (conn, time.monotonic())
            self._start_watch()
        try:
            yield
        finally:
            with self._lock:
                self._busy.pop(key, None)

    def _start_closer(self) -> None:
        self._threads += 1
        threading.Thread(target=self._close_loop, name="leviath-fdclose",
                         daemon=True).start()

    def _close_loop(self) -> None:
        me = threading.get_ident()
        while True:
            with self._lock:
                self._idle += 1
            fd = self._queue.get()
            with self._lock:
                self._idle -= 1
            conn = fuse_connection(fd)
            with self._lock:
                self._busy[me] = (conn, time.monotonic())
            with contextlib.suppress(OSError):
                os.close(fd)
            with self._lock:
                self._busy.pop(me, None)
                self._pending -= 1
                if self._pending == 0:
                    self._settled.notify_all()

    def wait_closed(self, timeout: float) -> bool:
        with self._lock:
            return self._settled.wait_for(lambda: self._pending == 0, timeout)

    def _watch(self) -> None:
        while True:
            time.sleep(PATIENCE / 4)
            now = time.monotonic()
            with self._lock:
                held = [(key, conn, since) for key, (conn, since) in self._busy.items()
                        if now - since > PATIENCE]
                # Only a held closer holds up the queue (a `watched` read
                # holds its own thread).
                stuck = sum(1 for key, _conn, _since in held if key > 0)
                idle = self._idle
                self._aborted &= {(key, since) for key, (_conn, since) in self._busy.items()}
            for key, conn, since in held:
                if conn is not None and (key, since) not in self._aborted:
                    self._aborted.add((key, since))
                    abort(conn)
            if stuck and idle == 0 and not self._queue.empty():
                with self._lock:
                    if self._threads < MAX_CLOSERS:
                        log.warning("a close of a client's descriptor has waited over %.0f s; "
                                    "another closer takes the queue", PATIENCE)
                        self._start_closer()


_CLOSERS = _Closers()


def discard(fd: int) -> None:
    """Close `fd`, which a client sent, soon, never on the caller's thread.
    The number must not be used again by the caller."""
    if fd >= 0:
        _CLOSERS.put(fd)


def discard_all(fds: Iterable[int]) -> None:
    for fd in fds:
        discard(fd)


@contextlib.contextmanager
def cut_off_if_held(fd: int) -> Iterator[None]:
    """Around blocking calls on `fd`, a file a client handed the daemon, in
    a worker thread: a FUSE server that holds them past PATIENCE has its
    connection aborted, and they fail (ENOTCONN) instead of holding the
    thread for ever (a shared pool's threads would run out, one call each)."""
    conn = fuse_connection(fd)
    if conn is None:
        yield
        return
    with _CLOSERS.watched(conn):
        yield


def wait_closed(timeout: float = 10.0) -> bool:
    """Whether every descriptor discarded so far is closed, waiting up to
    `timeout` seconds (for tests that count the daemon's descriptors)."""
    return _CLOSERS.wait_closed(timeout)


def fuse_connection(fd: int) -> str | None:
    """The fusectl name of the FUSE connection `fd` is a file of (its file
    system's device number), None for any other file. statx with an empty
    mask and AT_STATX_DONT_SYNC: the kernel then answers with the device
    alone, from memory, and never asks the file system's server (which
    refuses root anything else, without allow_other)."""
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    if _libc.statx(fd, b"", _AT_EMPTY_PATH | _AT_STATX_DONT_SYNC, 0, buf) != 0:
        return None
    major, minor = struct.unpack_from("<II", buf, _STATX_DEV)
    conn = str(major << 20 | minor)
    _ensure_fusectl()
    # fusectl lists every FUSE connection of the machine, whatever the
    # mount namespace: a device number it does not list is no FUSE mount.
    return conn if os.path.isdir(f"{FUSECTL}/{conn}") else None


_libc = ctypes.CDLL(None, use_errno=True)
_AT_EMPTY_PATH = 0x1000
_AT_STATX_DONT_SYNC = 0x4000
_STATX_SIZE = 256
# struct statx: stx_dev_major and stx_dev_minor, after the four timestamps.
_STATX_DEV = 136


def _fusectl_mounted() -> bool:
    try:
        with open("/proc/self/mountinfo", "rb") as mounts:
            return any(b" - fusectl " in line for line in mounts)
    except OSError:
        return False


def abort(conn: str) -> bool:
    """Abort FUSE connection `conn`: its held requests fail, and so does
    all later use of that mount."""
    path = f"{FUSECTL}/{conn}/abort"
    try:
        with open(path, "w") as knob:
            knob.write("1")
    except OSError as exc:
        log.warning("a FUSE server holds the close of a client's descriptor and its "
                    "connection %s cannot be aborted: %s", conn, exc.strerror)
        return False
    log.warning("aborted FUSE connection %s: its server held the close of a descriptor "
                "a client sent for over %.0f s", conn, PATIENCE)
    return True


_fusectl_looked = False


def _ensure_fusectl() -> None:
    """fusectl mounted where it is not (once; in the unit's own mount
    namespace, where systemd's sys-fs-fuse-connections.mount may be missing)."""
    global _fusectl_looked
    if _fusectl_looked:
        return
    _fusectl_looked = True
    if not os.path.isdir(FUSECTL) or _fusectl_mounted():
        return  # no FUSE in this kernel, or mounted already
    if _libc.mount(b"fusectl", FUSECTL.encode(), b"fusectl", 0, None) != 0:
        log.warning("cannot mount fusectl on %s (%s): a FUSE server that holds the close of a "
                    "client's descriptor cannot be cut off", FUSECTL,
                    os.strerror(ctypes.get_errno()))
