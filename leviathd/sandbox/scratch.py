"""An agent's scratch: its home, its /tmp and its throwaway layers, on a tmpfs
of a bounded size that no user can reach from the host.

On disk there is only `<scratch_dir>/` (root's, 0711) and in it
`<scratch_dir>/<execution>/` (root's, 0700): an empty mount point. The agent's
supervisor (root, already in the agent's scope) unshares a mount namespace of
its own, a slave of the daemon's, and mounts a tmpfs of `scratch_size` bytes
there; only that namespace and the fences built from it ever see it. Its
folders are made through directory descriptors while root owns them, and
`home` and `tmp` are handed to the user last (fchown on the descriptor), when
nothing of root's will open anything in them by name again: the launcher mounts
them from descriptors taken beneath the tmpfs root, which no user can enter.
So nobody can swap a scratch folder for a link while root works in it, and
what an agent writes there is bounded (writes past the limit fail with ENOSPC)
and charged to the agent's own memory cgroup, never to /var/lib/leviath.

Removal walks by descriptor, never follows a link and never crosses a mount.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import posixpath
import re
import stat
from collections.abc import Collection

from leviathd import fsat
from leviathd.errors import Unavailable
from leviathd.sandbox import loopfs
from leviathd.sandbox.spec import DEFAULT_SCRATCH_SIZE, SandboxSpec

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

CLONE_NEWNS = 0x00020000
MS_NOSUID = 2
MS_NODEV = 4
MS_NOATIME = 1024
MS_REC = 16384
MS_SLAVE = 1 << 19
MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]  # fmt: skip
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]


def _sys(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


# --- descriptor walks ----------------------------------------------------------


def open_root_dir(path: str, *, create: bool = True) -> int:
    """A descriptor on `path`, walked from / one component at a time without
    following links, every step a real folder owned by root that nobody else
    may write (missing ones made 0755 when `create`); the last is made 0711."""
    path = posixpath.normpath(path)
    if not path.startswith("/"):
        raise Unavailable(f"scratch folder {path} is not absolute")
    fd = os.open("/", _DIR)
    try:
        parts = [p for p in path.split("/") if p]
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o711 if last else 0o755, dir_fd=fd)
            try:
                nfd = os.open(part, _DIR, dir_fd=fd)
            except OSError as exc:
                raise Unavailable(f"scratch folder {path}: {part}: {exc.strerror}") from exc
            os.close(fd)
            fd = nfd
            st = os.fstat(fd)
            # A sticky folder (/var/tmp) lets nobody but root move root's entries.
            if st.st_uid != 0 or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
                raise Unavailable(
                    f"scratch folder {path}: {part} is not root's alone (owner {st.st_uid}, "
                    f"mode {stat.S_IMODE(st.st_mode):o})"
                )
            if last and stat.S_IMODE(st.st_mode) & 0o066:
                os.fchmod(fd, 0o711)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_beneath(dirfd: int, relpath: str, flags: int = os.O_PATH) -> int:
    """Open `relpath` beneath `dirfd`, refusing a link at every step."""
    parts = [p for p in relpath.split("/") if p and p != "."]
    if not parts or ".." in parts:
        raise Unavailable(f"{relpath!r} is not a plain path beneath its folder")
    fd = os.dup(dirfd)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            nfd = os.open(part, (flags if last else _DIR) | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)  # fmt: skip
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _mkdir_at(dirfd: int, name: str, mode: int) -> int:
    """A new or existing folder `name` in `dirfd`, opened without following a link."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, mode, dir_fd=dirfd)
    return os.open(name, _DIR, dir_fd=dirfd)


# --- on disk: the mount point --------------------------------------------------


def _split(spec: SandboxSpec) -> tuple[str, str]:
    parent, name = posixpath.split(posixpath.normpath(spec.scratch))
    if not _ID.match(name):
        raise Unavailable(f"scratch folder {spec.scratch} is not named by an execution id")
    return parent, name


def create(spec: SandboxSpec) -> str:
    """Make the execution's (empty, root-owned 0700) scratch mount point;
    idempotent. Returns its path."""
    parent, name = _split(spec)
    pfd = open_root_dir(parent)
    try:
        fd = _mkdir_at(pfd, name, 0o700)
        try:
            st = os.fstat(fd)
            if st.st_uid != 0 or stat.S_IMODE(st.st_mode) != 0o700:
                raise Unavailable(f"scratch folder {spec.scratch} exists and is not root's")
        finally:
            os.close(fd)
    except OSError as exc:
        raise Unavailable(f"cannot make scratch folder {spec.scratch}: {exc.strerror}") from exc
    finally:
        os.close(pfd)
    return spec.scratch


# --- in the agent's mount namespace: the tmpfs ---------------------------------


def open_mounted(spec: SandboxSpec) -> int | None:
    """A descriptor on the root of the execution's scratch tmpfs as this
    process sees it, or None when it is not mounted here."""
    parent, name = _split(spec)
    pfd = open_root_dir(parent, create=False)
    try:
        fd = os.open(name, _DIR, dir_fd=pfd)
        st, pst = os.fstat(fd), os.fstat(pfd)
    finally:
        os.close(pfd)
    if st.st_dev == pst.st_dev:
        os.close(fd)
        return None
    if st.st_uid != 0 or stat.S_IMODE(st.st_mode) != 0o700:
        os.close(fd)
        raise Unavailable(f"scratch {spec.scratch} is mounted but not root's alone")
    return fd


def enter(spec: SandboxSpec, image: int | None = None) -> None:
    """Give this process a mount namespace of its own with the execution's
    scratch mounted and filled. Needs root; changes this process's
    namespace for good (call it in a process made for the agent).
    `image`: an empty unnamed file for the ext4 (loopfs.make), closed here."""
    if image is not None and spec.scratch_fs != "ext4":
        os.close(image)
        image = None
    parent, name = _split(spec)
    _sys(_libc.unshare(CLONE_NEWNS), "unshare")
    # A slave: the host's later mounts still reach us, ours never leave.
    _sys(_libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None), "make / a slave")
    # One walk, after the unshare (a descriptor from before it names the
    # old namespace's mounts, where ours would be neither made nor seen);
    # the folders it makes are the host's all the same (create()'s checks).
    pfd = open_root_dir(parent)
    try:
        try:
            fd = _mkdir_at(pfd, name, 0o700)
        except OSError as exc:
            raise Unavailable(
                f"cannot make scratch folder {spec.scratch}: {exc.strerror}") from exc
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        if st.st_uid != 0 or stat.S_IMODE(st.st_mode) != 0o700:
            raise Unavailable(f"scratch folder {spec.scratch} exists and is not root's")
        _mount_scratch(spec, pfd, name, image)
        image = None
        # From the same parent, now in this namespace: the new filesystem's
        # root (open_mounted's checks, without walking again).
        root = os.open(name, _DIR, dir_fd=pfd)
        try:
            st, pst = os.fstat(root), os.fstat(pfd)
            if spec.scratch_fs == "ext4" and st.st_dev != pst.st_dev and st.st_uid == 0:
                # mkfs made the root 0755 and a lost+found: ours alone, empty.
                os.fchmod(root, 0o700)
                with contextlib.suppress(OSError):
                    os.rmdir("lost+found", dir_fd=root)
                st = os.fstat(root)
            if st.st_dev == pst.st_dev or st.st_uid != 0 or stat.S_IMODE(st.st_mode) != 0o700:
                raise Unavailable(f"the scratch on {spec.scratch} did not mount")
            _fill(root, spec)
        finally:
            os.close(root)
    finally:
        os.close(pfd)
        if image is not None:
            os.close(image)


def _mount_scratch(spec: SandboxSpec, pfd: int, name: str, image: int | None = None) -> None:
    """Mount the execution's scratch on `name` in `pfd` (this namespace
    only): its own ext4 on disk (sandbox/loopfs.py) where the spec says so,
    else a tmpfs; `scratch_size` bytes either way."""
    size = spec.scratch_size or DEFAULT_SCRATCH_SIZE
    fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
    try:
        target = f"/proc/self/fd/{fd}".encode()
        if spec.scratch_fs != "ext4":
            _sys(_libc.mount(b"tmpfs", target, b"tmpfs", MS_NOSUID | MS_NODEV,
                             f"mode=0700,uid=0,gid=0,size={size}".encode()),
                 "mount the scratch tmpfs")  # fmt: skip
            return
        dev, path = loopfs.make(pfd, size, image)
        try:
            # discard: what the agent deletes goes back to the host's disk.
            # nobarrier: no cache flush reaches the host's disk through the
            # loop device (an fsync there would be the host file's fsync), as
            # nothing in scratch outlives the agent; ~40 ms of every end
            # here went to the flush of the unmount. noinit_itable: no
            # kernel thread zeroing inode tables (mkfs leaves them to it).
            _sys(_libc.mount(path.encode(), target, b"ext4", MS_NOSUID | MS_NODEV | MS_NOATIME,
                             b"discard,nobarrier,noinit_itable,errors=remount-ro"),
                 "mount the scratch filesystem")  # fmt: skip
        finally:
            # The mount holds the device now; autoclear frees it with the mount.
            os.close(dev)
    finally:
        os.close(fd)


def _fill(root: int, spec: SandboxSpec) -> None:
    """home and tmp (the user's, handed over last) and the throwaway layers
    (root's; the launcher gives `upper` the lower folder's owner)."""
    layers = sum(1 for m in spec.mounts if m.kind == "overlay")
    if layers:
        ofd = _mkdir_at(root, "overlay", 0o700)
        try:
            for n in range(layers):
                lfd = _mkdir_at(ofd, str(n), 0o700)
                try:
                    for name in ("upper", "work"):
                        os.close(_mkdir_at(lfd, name, 0o700))
                finally:
                    os.close(lfd)
        finally:
            os.close(ofd)
    for name in ("home", "tmp"):
        fd = _mkdir_at(root, name, 0o700)
        try:
            os.fchown(fd, spec.uid, spec.gid)
        finally:
            os.close(fd)


def leave(spec: SandboxSpec) -> None:
    """Detach the scratch tmpfs from this process's namespace (its content
    goes with the last namespace holding it)."""
    with contextlib.suppress(OSError):
        _sys(_libc.umount2(spec.scratch.encode(), MNT_DETACH | UMOUNT_NOFOLLOW), "umount")


# --- removal -------------------------------------------------------------------


def _remove_name(pfd: int, name: str) -> bool:
    st = fsat.lstat_at(pfd, name)
    if st is None:
        return False
    if stat.S_ISDIR(st.st_mode) and st.st_dev != os.fstat(pfd).st_dev:
        raise Unavailable(f"scratch folder {name} is still mounted here")
    fsat.remove_tree_at(pfd, name)
    return True


def remove(path: str) -> bool:
    """Remove one scratch folder (older versions left the user's files on
    disk in it); False if it was not there. Never follows a link, never
    crosses a mount: a mount beneath it is an error to look at."""
    parent, name = posixpath.split(posixpath.normpath(path))
    if not _ID.match(name):
        raise Unavailable(f"{path} is not a scratch folder")
    try:
        pfd = open_root_dir(parent, create=False)
    except Unavailable:
        if not os.path.lexists(parent):
            return False
        raise
    try:
        return _remove_name(pfd, name)
    except OSError as exc:
        raise Unavailable(f"cannot remove scratch folder {path}: {exc.strerror}") from exc
    finally:
        os.close(pfd)


def sweep(scratch_dir: str, live: Collection[str]) -> list[str]:
    """Remove the folders of executions not in `live`; returns what went.
    Names that are not execution ids are left alone."""
    try:
        pfd = open_root_dir(scratch_dir, create=False)
    except Unavailable:
        if not os.path.lexists(scratch_dir):
            return []
        raise
    removed = []
    try:
        for name in sorted(os.listdir(pfd)):
            if name.startswith(loopfs.IMAGE_PREFIX):
                # An image file a crash left between its creation and its
                # unlink (loopfs._unnamed_file); a loop device keeps its own.
                with contextlib.suppress(OSError):
                    fsat.unlink_at(pfd, name)
                continue
            if name in live or not _ID.match(name):
                continue
            with contextlib.suppress(Unavailable, OSError):
                if _remove_name(pfd, name):
                    removed.append(name)
    finally:
        os.close(pfd)
    return removed

