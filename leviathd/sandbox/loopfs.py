"""A small ext4 of its own for one agent's scratch, on disk and bounded.

An unnamed sparse file (O_TMPFILE) of `scratch_size` bytes in the root-only
scratch folder, made an ext4 by mkfs.ext4, attached to a free loop device
with autoclear and direct I/O: the device lets go of the file when its last mount goes,
and the file, which no name ever reached, goes with it. So nothing of the
scratch stays on disk however the agent ends (its mount namespaces die with
its processes), there is nothing for a user to reach or swap by name, and
what the agent writes is bounded by its own filesystem (ENOSPC at the
limit), not by its memory: what it writes is page cache, which the kernel
writes back and reclaims, rather than tmpfs pages charged to `memory_max`.

Where the host has no loop devices or no mkfs.ext4 (a container without
/dev/loop-control), `backing()` says "tmpfs" and the scratch is a tmpfs of
the same size, as before (docs/sandbox.md; `lev inspect` says which).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import stat
import struct
import subprocess

from leviathd.errors import Unavailable

LOOP_CONTROL = "/dev/loop-control"
MKFS_CANDIDATES = ("/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4")

_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
_LO_FLAGS_DIRECT_IO = 16
# struct loop_info64 (linux/loop.h): five u64, four u32, three name/key
# arrays, two u64; struct loop_config: fd, block_size, the info, 8 u64.
_INFO64 = struct.Struct("=QQQQQIIII64s64s32sQQ")
_CONFIG_HEAD = struct.Struct("=II")
_BLOCK = 4096
# Free loop devices are shared with every other user of the host's loop
# devices: one taken between our GET_FREE and our CONFIGURE is tried again.
_ATTEMPTS = 16
MKFS_TIMEOUT = 60.0
# mkfs.ext4 cannot build one smaller (64 KiB: "Not enough space"): a smaller
# scratch_size gets this much (docs/configuration.md).
MIN_SIZE = 1 << 20
# Named image files (a filesystem without O_TMPFILE) start so; never an
# execution id (scratch._ID), and the sweep removes them.
IMAGE_PREFIX = ".image-"


def _trusted(path: str) -> bool:
    """A root-owned program nobody else may replace."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def mkfs_path() -> str | None:
    return next((p for p in MKFS_CANDIDATES if _trusted(p)), None)


def backing() -> str:
    """What this host gives an agent's scratch: "ext4" (on disk, through a
    loop device) or "tmpfs" (memory), decided when the spec is built."""
    if os.path.exists(LOOP_CONTROL) and mkfs_path() is not None:
        return "ext4"
    return "tmpfs"


def unnamed_file(dir_fd: int) -> int:
    """A new, empty, root-only file in `dir_fd` that no name reaches (the
    daemon makes one per agent and keeps a copy, agents/start.py)."""
    try:
        return os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
    # A filesystem without O_TMPFILE: a fresh name in the root-only folder,
    # unlinked at once (nothing else opens it by name).
    name = f"{IMAGE_PREFIX}{secrets.token_hex(8)}"
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dir_fd)  # fmt: skip
    # The sweep removes one a crash left here; it may have come first.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
    return fd


def _mkfs(image: int) -> None:
    mkfs = mkfs_path()
    if mkfs is None:
        raise Unavailable("mkfs.ext4 is not installed (package e2fsprogs)")
    # No journal (scratch never outlives a crash), no reserved blocks (the
    # whole size is the agent's), no room to grow (resize_inode: 656 KB of
    # the host's disk written per agent instead of 144 KB, and as much to
    # free, with discards, at its end); the root folder root's
    # (scratch.enter makes it 0700).
    argv = [mkfs, "-q", "-F", "-b", str(_BLOCK), "-m", "0", "-O", "^has_journal,^resize_inode",
            "-E", "root_owner=0:0,nodiscard,lazy_itable_init=1", f"/proc/self/fd/{image}"]
    try:
        done = subprocess.run(argv, pass_fds=(image,), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
                              timeout=MKFS_TIMEOUT, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"mkfs.ext4 for the scratch: {exc}") from exc
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip()[:300]
        raise Unavailable(f"mkfs.ext4 for the scratch failed ({done.returncode}): {said}")


def _device_node(number: int) -> str:
    """/dev/loopN, made (0600, root's) where /dev lacks it: a container's
    /dev of a few nodes has no devtmpfs to make it for us."""
    path = f"/dev/loop{number}"
    if os.path.exists(path):
        return path
    with open(f"/sys/devices/virtual/block/loop{number}/dev", encoding="ascii") as f:
        major, minor = (int(x) for x in f.read().strip().split(":"))
    with contextlib.suppress(FileExistsError):
        os.mknod(path, 0o600 | stat.S_IFBLK, os.makedev(major, minor))
    return path


def _config(image: int, flags: int) -> bytes:
    info = _INFO64.pack(0, 0, 0, 0, 0, 0, 0, 0, flags, b"", b"", b"", 0, 0)
    return _CONFIG_HEAD.pack(image, _BLOCK) + info + bytes(64)


def _attach(image: int) -> tuple[int, str]:
    """A free loop device backed by `image`, autoclear: (its descriptor,
    its path). The device stays while the descriptor or a mount holds it."""
    ctl = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
    # Buffered I/O on the file, not direct: with direct I/O the unmount at
    # the agent's end wrote what was dirty to the host's disk and waited
    # for it (+125 ms of an attached `lev run -- true` here); buffered, it
    # lands in the file's page cache, dropped unwritten when the file goes.
    # The agent's data sits in two caches (its ext4's and the file's),
    # both reclaimable: bench/scratch_bench.py, 500 MB written and read
    # back under memory_max = 512M, 0.67x the host's time (its peer in a
    # scope of 512M too). Set after configuring (LOOP_SET_DIRECT_IO),
    # direct I/O also fsync'd mkfs's writes first, ~60 ms of a start.
    flags = _LO_FLAGS_AUTOCLEAR
    try:
        for _ in range(_ATTEMPTS):
            number = fcntl.ioctl(ctl, _LOOP_CTL_GET_FREE)
            path = _device_node(number)
            dev = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            st = os.fstat(dev)
            if not stat.S_ISBLK(st.st_mode) or st.st_uid != 0:
                os.close(dev)
                raise Unavailable(f"{path} is not root's loop device")
            try:
                fcntl.ioctl(dev, _LOOP_CONFIGURE, _config(image, flags))
            except OSError as exc:
                os.close(dev)
                if exc.errno == errno.EBUSY:
                    continue  # someone else took it first
                if exc.errno == errno.EINVAL and flags & _LO_FLAGS_DIRECT_IO:
                    flags &= ~_LO_FLAGS_DIRECT_IO  # a file that cannot do direct I/O
                    continue
                raise
            return dev, path
    finally:
        os.close(ctl)
    raise Unavailable("no free loop device for the scratch")


def user_bound(share: str, total: int) -> int:
    """What one user's agents' scratch may take of a filesystem of `total`
    bytes: `share` is "NN%" of it or a size in bytes."""
    if share.endswith("%"):
        return total * int(share[:-1]) // 100
    return int(share)


def prepare(image: int, size: int, mine: int = 0, share: str | None = None) -> None:
    """Size and format `image` as the agent's ext4, in the daemon before the
    agent is started (issue 48): a scratch that cannot be made (the disk
    under `scratch_dir` full, mkfs missing or failing), or that would make
    the user's agents' scratch (`mine`, the scratch_size of their other
    agents) take more than `share` of scratch_dir's filesystem, refuses the
    start with the reason, instead of an agent that ends with status 127 and
    no word, or one user filling the disk under everyone's agents.
    Raises Unavailable."""
    if share is not None:
        st = os.fstatvfs(image)
        bound = user_bound(share, st.f_blocks * st.f_frsize)
        if mine + image_size(size) > bound:
            raise Unavailable(
                f"this agent's scratch ({image_size(size) >> 20} MiB) and the "
                f"{mine >> 20} MiB of your running agents' would take more than the "
                f"{bound >> 20} MiB of scratch_dir's filesystem one user's agents may "
                f"([sandbox] scratch_user_max = \"{share}\"): end one of them, or ask "
                "the admin for a smaller scratch_size")
    try:
        if not fresh(image, size):
            # Anything else (an empty file, or one that is not a new ext4 of
            # this size) is wiped: truncated to nothing, its blocks freed,
            # then made anew; whatever it held is never an agent's.
            os.ftruncate(image, 0)
            os.ftruncate(image, image_size(size))
            _mkfs(image)
    except OSError as exc:
        raise Unavailable(
            f"cannot make the agent's scratch filesystem ({size} bytes) in scratch_dir: "
            f"{exc.strerror or exc}") from exc


def image_size(size: int) -> int:
    return max(size, MIN_SIZE)


# The ext4 superblock (1 KiB in): what tells a new filesystem from one ever
# mounted (kernel's fs/ext4/ext4.h, struct ext4_super_block).
_SB_OFFSET = 1024
_SB = struct.Struct("<4xI16xI16xI4xH2xH")  # blocks (lo), log block size, mtime, mounts, magic
_EXT4_MAGIC = 0xEF53


def fresh(image: int, size: int) -> bool:
    """Whether `image` is a new ext4 of `size` that nothing ever mounted: a
    root-only unnamed file, of that size, whose superblock has no mount
    time and a mount count of 0 (a mount writes both to the file at once).
    A scratch made ahead (sandbox/scratchpool.py) is handed to an agent
    only so; anything else is wiped and made anew (prepare)."""
    st = os.fstat(image)
    if (not stat.S_ISREG(st.st_mode) or st.st_nlink != 0 or st.st_uid != 0
            or st.st_mode & 0o077 or st.st_size != image_size(size)):
        return False
    raw = os.pread(image, _SB.size, _SB_OFFSET)
    if len(raw) != _SB.size:
        return False
    blocks, log_block, mtime, mounts, magic = _SB.unpack(raw)
    block = 1024 << min(int(log_block), 6)
    return bool(magic == _EXT4_MAGIC and mounts == 0 and mtime == 0
            and st.st_size - block < blocks * block <= st.st_size)


def make(dir_fd: int, size: int, image: int | None = None) -> tuple[int, str]:
    """An ext4 of `size` bytes on an unnamed file in `dir_fd` (or on `image`,
    an empty one the daemon made, which this closes), on a loop device: (the
    device's descriptor, its path). Mount it, then close the descriptor; the
    device and the file go with the last mount and the last copy of
    `image`: the daemon's, closed off the agent's way out (its host's
    discards of the file's blocks took ~40 ms of every agent's end here)."""
    if image is None:
        image = unnamed_file(dir_fd)
    try:
        if os.fstat(image).st_size == 0:  # not made by the daemon (prepare)
            os.ftruncate(image, image_size(size))
            _mkfs(image)
        return _attach(image)
    except OSError as exc:
        raise Unavailable(f"cannot make the scratch filesystem: {exc.strerror or exc}") from exc
    finally:
        os.close(image)
