"""Scratch file systems made ahead (issue 47): a few new, never-mounted ext4
images (sandbox/loopfs.py) kept ready, so that a start takes one instead of
waiting for mkfs.ext4 in its user's planning lane (62-144 ms a start here).

Each image is an unnamed root-only file in scratch_dir that only this pool
holds. `take` removes it from the pool: it is handed to one agent, whose
end closes it and so frees it (loopfs.make); nothing ever puts an image
back. The start still checks it before use (loopfs.prepare: `fresh`, a new
ext4 of the right size that nothing ever mounted; anything else is wiped
and made anew), so no image that any agent's mount has touched reaches
another agent, of the same user or another.

Bounded: at most `capacity` images, all for one (scratch_dir, size), the
last a start asked for; a start for another pair drops them. Made one at a
time in a thread of the pool's own, never in a start's way: a start that
finds the pool empty makes its own, as before. Nothing of the pool is on
disk by name, so a daemon that ends leaves none of it behind.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import os
import threading

from leviathd.errors import Unavailable
from leviathd.sandbox import loopfs, scratch

# A burst of starts beyond this makes its own (the pool refills meanwhile);
# each ready image takes ~150 KB of scratch_dir's disk (the metadata mkfs
# writes) and one descriptor of the daemon.
CAPACITY = 2


class ScratchPool:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._key: tuple[str, int] | None = None
        self._ready: list[int] = []
        self._stale: list[int] = []
        # The pool thread's own: a new ext4 never handed out or mounted,
        # which the ready ones are copies of.
        self._template: tuple[tuple[str, int], int] | None = None
        self._filling = False
        self._closed = False
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="scratch-pool")

    def take(self, scratch_dir: str, size: int) -> int | None:
        """A ready image for this scratch_dir and size, the pool's last
        copy of it given away (the caller owns it, and it is never handed
        out again), or None; asks for the pool to be refilled either way.
        No I/O: fit for the event loop."""
        key = (scratch_dir, loopfs.image_size(size))
        with self._lock:
            image = self._ready.pop() if self._key == key and self._ready else None
        self.want(scratch_dir, size)
        return image

    def want(self, scratch_dir: str, size: int) -> None:
        """Keep images of this pair ready from now on (made in the pool's
        thread)."""
        key = (scratch_dir, loopfs.image_size(size))
        with self._lock:
            if self._closed:
                return
            if self._key != key:
                # Closed in the pool's thread: freeing a file's blocks is
                # disk work, not the event loop's.
                self._stale += self._ready
                self._ready, self._key = [], key
            if self._filling:
                return
            self._filling = True
        try:
            self._pool.submit(self._fill)
        except RuntimeError:  # shut down
            with self._lock:
                self._filling = False

    def ready(self) -> int:
        with self._lock:
            return len(self._ready)

    def idle(self) -> bool:
        """Nothing being made now."""
        with self._lock:
            return not self._filling

    def close(self) -> None:
        with self._lock:
            self._closed = True
            drop, self._ready, self._stale = self._ready + self._stale, [], []
        for fd in drop:
            with contextlib.suppress(OSError):
                os.close(fd)
        # The template is the pool thread's: it closes it after what is queued.
        with contextlib.suppress(RuntimeError):
            self._pool.submit(self._drop_template)
        self._pool.shutdown(wait=False)

    def _drop_template(self) -> None:
        if self._template is not None:
            os.close(self._template[1])
            self._template = None

    def _fill(self) -> None:
        try:
            while True:
                with self._lock:
                    key = self._key
                    stale, self._stale = self._stale, []
                    closed = self._closed
                    if self._closed or key is None or len(self._ready) >= self._capacity:
                        self._filling = False
                        full = True
                    else:
                        full = False
                for fd in stale:
                    os.close(fd)
                if self._template is not None and (self._template[0] != key or closed):
                    # Kept while images of its pair are wanted.
                    os.close(self._template[1])
                    self._template = None
                if full or key is None:
                    return
                if self._template is None:
                    self._template = (key, _make(*key, None))
                image = _make(*key, self._template[1])
                with self._lock:
                    # (only this thread adds: the count checked above holds)
                    keep = not self._closed and self._key == key
                    if keep:
                        self._ready.append(image)
                if not keep:
                    os.close(image)
        except Exception:
            # (scratch_dir's disk full, mkfs missing: a start makes its own
            # and says why; the pool tries again at the next start)
            with self._lock:
                self._filling = False


def _new_file(scratch_dir: str) -> int:
    dfd = scratch.open_root_dir(scratch_dir)
    try:
        return loopfs.unnamed_file(dfd)
    finally:
        os.close(dfd)


def _make(scratch_dir: str, size: int, template: int | None) -> int:
    """A new ext4 of `size` on an unnamed file in scratch_dir, checked: a
    copy of `template` (a new ext4 nothing mounts, made once by mkfs.ext4),
    or where that copy cannot be made, mkfs.ext4's own."""
    image = _new_file(scratch_dir)
    try:
        copied = False
        if template is not None:
            try:
                _copy(template, image, loopfs.image_size(size))
                copied = True
            except OSError:
                os.ftruncate(image, 0)
        if not copied:
            loopfs.prepare(image, size)
        if not loopfs.fresh(image, size):
            raise Unavailable("a scratch made ahead is not a new ext4")
    except BaseException:
        os.close(image)
        raise
    return image


def _copy(src: int, dst: int, size: int) -> None:
    """`src`'s data (mkfs wrote ~150 KB of a sparse file) into `dst`, holes
    kept: a fraction of mkfs.ext4's CPU, without a process. The copies
    share the template's UUID and directory hash seed, which no agent can
    read (it has no access to the device) and which protect nothing
    between agents, each alone on its filesystem."""
    os.ftruncate(dst, size)
    pos = 0
    while pos < size:
        try:
            data = os.lseek(src, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data past pos
                return
            raise
        hole = min(os.lseek(src, data, os.SEEK_HOLE), size)
        at = data
        while at < hole:
            done = os.copy_file_range(src, dst, hole - at, at, at)
            if done <= 0:
                raise OSError(errno.EIO, "short copy of the scratch template")
            at += done
        pos = hole
