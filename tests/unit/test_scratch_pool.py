"""Issue 47 item 2: scratch filesystems made ahead (sandbox/scratchpool.py)
and the check every scratch passes before an agent gets it
(loopfs.fresh/prepare). The bed side, from inside agents of two users, is
tests/integration/test_scratch_disk.py's pooled-scratch test."""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from leviathd.sandbox import loopfs, scratchpool

SIZE = 8 << 20


def _mkfs_stand_in(image: int) -> None:
    """A stand-in for mkfs.ext4 (Debian 13's build root, where the unit tests
    also run, has no e2fsprogs): the superblock fields loopfs.fresh reads,
    as mkfs leaves them. The bed's tests make and mount real ones."""
    raw = bytearray(1024)
    struct.pack_into("<I", raw, 4, os.fstat(image).st_size // 4096)
    struct.pack_into("<I", raw, 24, 2)  # 1024 << 2
    struct.pack_into("<H", raw, 56, 0xEF53)
    os.pwrite(image, bytes(raw), 1024)
    os.pwrite(image, b"\0" * 4096, 8192)  # (what mkfs writes besides, zeroed)


@pytest.fixture
def scratch_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.fail("needs root, as the daemon (its scratch files are root's)")
    monkeypatch.setattr(loopfs, "_mkfs", _mkfs_stand_in)
    d = tmp_path / "scratch"
    d.mkdir(mode=0o711)
    yield str(d)


def _wait_ready(pool: scratchpool.ScratchPool, n: int) -> None:
    """Waits (bounded) for what the pool's thread makes; asserts nothing on time."""
    deadline = time.monotonic() + 60
    while pool.ready() < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.ready() >= n


def _mounted(image: int) -> None:
    """What a mount leaves in the superblock (a mount count and time)."""
    raw = bytearray(os.pread(image, 1024, 1024))
    struct.pack_into("<I", raw, 44, int(time.time()))
    struct.pack_into("<H", raw, 52, 1)
    os.pwrite(image, bytes(raw), 1024)


def test_an_empty_pool_gives_nothing_and_the_start_makes_its_own(scratch_dir: str) -> None:
    pool = scratchpool.ScratchPool(capacity=1)
    try:
        assert pool.take(scratch_dir, SIZE) is None  # a start makes its own
        dfd = os.open(scratch_dir, os.O_RDONLY | os.O_DIRECTORY)
        image = loopfs.unnamed_file(dfd)
        os.close(dfd)
        loopfs.prepare(image, SIZE)
        assert loopfs.fresh(image, SIZE)
        os.close(image)
    finally:
        pool.close()


def test_the_pool_is_bounded_and_never_hands_out_one_image_twice(scratch_dir: str) -> None:
    pool = scratchpool.ScratchPool(capacity=2)
    try:
        pool.want(scratch_dir, SIZE)
        _wait_ready(pool, 2)
        pool.want(scratch_dir, SIZE)  # full: nothing more is made
        deadline = time.monotonic() + 60
        while not pool.idle() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pool.idle() and pool.ready() == 2
        # Kept open, as agents keep theirs (a closed file's inode number
        # may come again).
        taken: list[int] = []
        seen: set[tuple[int, int]] = set()
        for _ in range(4):
            _wait_ready(pool, 1)
            image = pool.take(scratch_dir, SIZE)
            assert image is not None
            taken.append(image)
            st = os.fstat(image)
            assert (st.st_dev, st.st_ino) not in seen  # each file given once
            seen.add((st.st_dev, st.st_ino))
            assert loopfs.fresh(image, SIZE)
            assert st.st_nlink == 0  # no name reaches it
            assert pool.ready() <= 2
        for image in taken:
            os.close(image)
        # What they are copies of is never handed out, never mounted.
        assert pool._template is not None and loopfs.fresh(pool._template[1], SIZE)
        # Another scratch_dir or size: what was ready for the old one goes.
        assert pool.take(scratch_dir, 2 * SIZE) is None
        _wait_ready(pool, 2)
        assert pool.take(scratch_dir, SIZE) is None
    finally:
        pool.close()
    assert pool.ready() == 0


def test_a_mounted_or_written_image_is_never_fresh_and_is_wiped(scratch_dir: str) -> None:
    dfd = os.open(scratch_dir, os.O_RDONLY | os.O_DIRECTORY)
    image = loopfs.unnamed_file(dfd)
    os.close(dfd)
    try:
        assert not loopfs.fresh(image, SIZE)  # empty
        loopfs.prepare(image, SIZE)
        assert loopfs.fresh(image, SIZE)
        assert not loopfs.fresh(image, 2 * SIZE)  # another size
        # An agent's data past the metadata, then a mount's marks.
        os.pwrite(image, b"alice's secret", SIZE - 4096)
        _mounted(image)
        assert not loopfs.fresh(image, SIZE)
        loopfs.prepare(image, SIZE)  # as a start does with what the pool gave
        assert loopfs.fresh(image, SIZE)
        assert b"alice's secret" not in os.pread(image, 4096, SIZE - 4096)
    finally:
        os.close(image)


def test_a_named_or_shared_file_is_never_fresh(scratch_dir: str) -> None:
    path = os.path.join(scratch_dir, "named")
    image = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        loopfs.prepare(image, SIZE)
        assert not loopfs.fresh(image, SIZE)  # a name reaches it
        os.unlink(path)
        assert loopfs.fresh(image, SIZE)
        os.fchmod(image, 0o644)
        assert not loopfs.fresh(image, SIZE)
    finally:
        os.close(image)
