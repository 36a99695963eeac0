"""File operations under a directory descriptor, for root in folders a user can write.

The daemon runs as root. A path that passes through a folder a user (or an
agent) can write is not a name for anything: between two system calls the
user may rename an entry away and put a symlink to /etc/shadow in its place,
and root's chmod/chown/open/unlink/rename by path then lands on the target.
So in such places root never resolves a path twice: it opens the folder once
(`O_DIRECTORY|O_NOFOLLOW`, component by component from `/`), and every later
operation names one entry relative to that descriptor with `*at()` calls that
do not follow a final symlink, or works on a descriptor it opened itself.

Names passed to the `*_at` helpers are single entries (no `/`, no `..`):
callers walk deeper with `open_dir_at`, one level at a time.

`scripts/check-bypath` refuses by-path chmod/chown/rename/unlink elsewhere in
leviathd/, so this module is where such calls live.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import stat
from collections.abc import Iterable

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# The folders on the way: search rights are all a path's walk needs (a user
# reaches her home under a /home of mode 0711), so they are passed with
# O_PATH and only the folder asked for is opened for reading.
_WALK_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Depth of descriptors remove_tree_at keeps open; deeper folders are moved up
# to the top of the tree being removed first, so a user's million-deep tree
# costs neither recursion nor a descriptor per level.
_MAX_DEPTH = 64
# remove_tree_at gives up after this many entries: a user who keeps refilling
# a folder while root empties it must not keep the daemon busy forever.
_MAX_REMOVALS = 1_000_000


def _entry(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"not a single folder entry: {name!r}")
    return name


def _components(path: str) -> list[str]:
    if not os.path.isabs(path):
        raise ValueError(f"not an absolute path: {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"'..' in a path root opens: {path!r}")
    return parts


def open_dir_at(dir_fd: int, name: str) -> int:
    """The folder `name` in `dir_fd`, refused (ELOOP/ENOTDIR) if it is a
    symlink or not a folder."""
    return os.open(_entry(name), DIR_FLAGS, dir_fd=dir_fd)


def open_dir(path: str, *, create_mode: int | None = None) -> int:
    """A descriptor on the folder at absolute `path`, opened one component at
    a time with O_NOFOLLOW. A symlink on the way is followed only when nobody
    but the caller (or root) could have put it there: the link and the folder
    holding it belong to root or to the caller, and that folder is writable by
    no group or other (so /var/run -> /run or a root-made /home -> /var/home
    work, and a link in a folder a user can write is refused with ELOOP). With
    `create_mode`, missing components are made (mkdirat) with that mode and the
    caller's ownership; existing ones are left as they are."""
    parts = _components(path)
    hops = 0
    fd = os.open("/", _WALK_FLAGS)
    try:
        i = 0
        while i < len(parts):
            part = parts[i]
            if create_mode is not None:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, create_mode, dir_fd=fd)
            try:
                nxt = os.open(part, _WALK_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                target = _trusted_link(fd, part)
                hops += 1
                if target is None or hops > 40:
                    raise
                # Lexical resolution is right here: every component before
                # this one is a real folder, not a link. Then walk again from /.
                base = "/" + "/".join(parts[:i])
                parts = _components(os.path.normpath(os.path.join(base, target))) + parts[i + 1:]
                os.close(fd)
                fd = os.open("/", _WALK_FLAGS)
                i = 0
                continue
            os.close(fd)
            fd = nxt
            i += 1
        walked, fd = fd, -1
        try:
            fd = os.open(".", DIR_FLAGS, dir_fd=walked)
        finally:
            os.close(walked)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    return fd


def _trusted_link(dir_fd: int, name: str) -> str | None:
    """The target of symlink `name` if only root or the caller could have made
    it (see open_dir), else None."""
    me = os.geteuid()
    folder = os.fstat(dir_fd)
    st = lstat_at(dir_fd, name)
    if (st is None or not stat.S_ISLNK(st.st_mode) or st.st_uid not in (0, me)
            or folder.st_uid not in (0, me) or folder.st_mode & 0o022):
        return None
    return os.readlink(name, dir_fd=dir_fd)


def open_parent(path: str, *, create_mode: int | None = None) -> tuple[int, str]:
    """(descriptor on the folder holding `path`, the last component)."""
    parts = _components(path)
    if not parts:
        raise ValueError("'/' has no parent")
    return open_dir("/" + "/".join(parts[:-1]), create_mode=create_mode), parts[-1]


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    """The entry's own status (a symlink's, not its target's); None if absent."""
    try:
        return os.stat(_entry(name), dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def mkdir_at(dir_fd: int, name: str, mode: int = 0o700, *, exist_ok: bool = False) -> None:
    try:
        os.mkdir(_entry(name), mode, dir_fd=dir_fd)
    except FileExistsError:
        if not exist_ok:
            raise


def subdir_at(dir_fd: int, name: str, mode: int = 0o700) -> int:
    """The folder `name` under dir_fd, made with `mode` when missing, opened
    without following a link (a link planted there fails with ELOOP/ENOTDIR)."""
    mkdir_at(dir_fd, name, mode, exist_ok=True)
    return open_dir_at(dir_fd, name)


def walk_at(dir_fd: int, parts: Iterable[str], *, create_mode: int | None = None) -> int:
    """The folder reached from dir_fd through `parts`, one entry at a time
    without following a link; each missing folder is made with `create_mode`
    (None: a missing one fails). A new descriptor; dir_fd stays open."""
    fd = os.dup(dir_fd)
    try:
        for part in parts:
            if create_mode is not None:
                mkdir_at(fd, part, create_mode, exist_ok=True)
            step = open_dir_at(fd, part)
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_at(dir_fd: int, name: str, flags: int, mode: int = 0o600) -> int:
    """os.open of one entry that never follows a symlink in its place (ELOOP)."""
    return os.open(_entry(name), flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)


def read_at(dir_fd: int, name: str, limit: int = 16 << 20) -> bytes:
    """A regular file's content, at most `limit` bytes (ValueError beyond);
    O_NONBLOCK so a FIFO in its place does not hang the caller."""
    fd = open_at(dir_fd, name, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{name} is not a regular file")
        data = bytearray()
        while chunk := os.read(fd, min(1 << 20, limit + 1 - len(data))):
            data += chunk
            if len(data) > limit:
                raise ValueError(f"{name} is larger than {limit} bytes")
        return bytes(data)
    finally:
        os.close(fd)


def chown_at(dir_fd: int, name: str, uid: int, gid: int) -> None:
    """fchownat(AT_SYMLINK_NOFOLLOW): a symlink in its place is changed itself."""
    os.chown(_entry(name), uid, gid, dir_fd=dir_fd, follow_symlinks=False)


def chmod_at(dir_fd: int, name: str, mode: int) -> None:
    """chmod of the entry itself, never of what a symlink there points to.
    (Linux has no fchmodat(AT_SYMLINK_NOFOLLOW) before fchmodat2, so the entry
    is pinned with O_PATH and changed through its /proc/self/fd link.)"""
    fd = os.open(_entry(name), os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            raise OSError(errno.ELOOP, f"{name} is a symlink")
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def set_owner_mode(fd: int, uid: int | None, gid: int | None, mode: int | None) -> None:
    """fchown then fchmod (chown clears set-id bits, so mode comes last), on a
    descriptor the caller opened; only root changes owners."""
    if (uid is not None or gid is not None) and os.geteuid() == 0:
        os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
    if mode is not None:
        os.fchmod(fd, mode)


def unlink_at(dir_fd: int, name: str, *, missing_ok: bool = True) -> None:
    try:
        os.unlink(_entry(name), dir_fd=dir_fd)
    except FileNotFoundError:
        if not missing_ok:
            raise


def unlink_path(path: str, *, missing_ok: bool = True) -> None:
    """Remove the file at `path`, every folder on the way opened by descriptor."""
    dfd, name = open_parent(path)
    try:
        unlink_at(dfd, name, missing_ok=missing_ok)
    finally:
        os.close(dfd)


def rmdir_at(dir_fd: int, name: str, *, missing_ok: bool = True) -> None:
    try:
        os.rmdir(_entry(name), dir_fd=dir_fd)
    except FileNotFoundError:
        if not missing_ok:
            raise


def rename_at(src_dir_fd: int, src: str, dst_dir_fd: int, dst: str) -> None:
    """renameat: moves the entries themselves (a symlink is moved, not followed)."""
    os.rename(_entry(src), _entry(dst), src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)


def atomic_write_at(
    dir_fd: int, name: str, data: bytes, *, mode: int = 0o600,
    uid: int | None = None, gid: int | None = None,
) -> None:
    """Replace `name` with `data` in one step: a fresh temp file (O_EXCL,
    O_NOFOLLOW) given its owner and mode by descriptor, written, fsynced,
    renamed over `name`, and the folder fsynced so the rename survives a crash."""
    tmp = f".{_entry(name)[:200]}.{secrets.token_hex(6)}.tmp"
    fd = open_at(dir_fd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            set_owner_mode(fd, uid, gid, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        rename_at(dir_fd, tmp, dir_fd, name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)


def empty_subdir_at(dir_fd: int, name: str, *, create_mode: int, uid: int, gid: int,
                    mode: int) -> None:
    """`name` under `dir_fd` as an empty folder of `uid`:`gid` with `mode`:
    a non-folder there is unlinked, a folder there is taken over in place
    (something may have it bound) and emptied, all by descriptor."""
    st = lstat_at(dir_fd, name)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        unlink_at(dir_fd, name)
    fd = subdir_at(dir_fd, name, create_mode)
    try:
        set_owner_mode(fd, uid, gid, mode)
        for entry in os.listdir(fd):
            remove_tree_at(fd, entry)
    finally:
        os.close(fd)


def remove_tree_at(dir_fd: int, name: str, *, missing_ok: bool = True) -> None:
    """rm -r of one entry under `dir_fd`, by descriptors only: symlinks are
    removed, never followed; a folder on another filesystem (a mount point)
    is not entered and makes it fail with EXDEV after removing what it can."""
    st = lstat_at(dir_fd, name)
    if st is None:
        if missing_ok:
            return
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)
    if not stat.S_ISDIR(st.st_mode):
        unlink_at(dir_fd, name)
        return
    top = open_dir_at(dir_fd, name)
    try:
        if os.fstat(top).st_ino != st.st_ino:
            raise OSError(errno.EAGAIN, f"{name} changed while being removed")
        _empty(top, st.st_dev)
    finally:
        os.close(top)
    rmdir_at(dir_fd, name)


def _empty(top: int, dev: int) -> None:
    stack = [top]
    budget = _MAX_REMOVALS
    stuck: set[int] = set()  # folders that hold a mount point: left in place
    foreign: list[str] = []
    try:
        while stack:
            fd = stack[-1]
            descended = left = False
            for entry in os.listdir(fd):
                budget -= 1
                if budget < 0:
                    raise OSError(errno.EAGAIN, "folder keeps refilling while being removed")
                try:
                    est = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not stat.S_ISDIR(est.st_mode):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry, dir_fd=fd)
                    continue
                if est.st_dev != dev or est.st_ino in stuck:
                    if est.st_dev != dev:
                        foreign.append(entry)
                    left = True
                    continue
                try:
                    os.rmdir(entry, dir_fd=fd)
                    continue
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
                if len(stack) >= _MAX_DEPTH:
                    # Too deep to descend: the folder moves up to `top`,
                    # descriptor to descriptor, one name, never followed.
                    rename_at(fd, entry, top, f".rm.{secrets.token_hex(8)}")
                    continue
                child = os.open(entry, DIR_FLAGS, dir_fd=fd)
                if os.fstat(child).st_ino != est.st_ino:
                    os.close(child)
                    continue
                stack.append(child)
                descended = True
                break
            if not descended:
                # Emptied as far as it goes; the parent's next listing removes it.
                done = stack.pop()
                if left:
                    stuck.add(os.fstat(done).st_ino)
                if done != top:
                    os.close(done)
    finally:
        for fd in stack:
            if fd != top:
                os.close(fd)
    if foreign:
        raise OSError(errno.EXDEV, f"mount points left in place: {', '.join(foreign[:5])}")


def bind_unix_at(
    dir_fd: int, name: str, *, mode: int = 0o600, uid: int | None = None,
    gid: int | None = None,
) -> socket.socket:
    """A unix stream socket bound at `name` in `dir_fd`, created with `mode`
    (the kernel gives the new inode the socket's own mode less the umask, so
    fchmod on the socket before bind sets it: there is no moment with a wider
    mode), then given `uid`/`gid` with fchownat(AT_SYMLINK_NOFOLLOW).

    The folder must be one that only root can write: between bind and the
    chown nobody else may swap the entry. A stale entry of that name is removed
    first. The socket is returned bound, not listening."""
    st = os.fstat(dir_fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(errno.EPERM, "a socket folder writable by others is refused")
    unlink_at(dir_fd, name)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.fchmod(sock.fileno(), mode)
        sock.bind(f"/proc/self/fd/{dir_fd}/{_entry(name)}")
        # The umask may have taken bits away (never added any): set it exactly.
        chmod_at(dir_fd, name, mode)
        if uid is not None or gid is not None:
            chown_at(dir_fd, name, -1 if uid is None else uid, -1 if gid is None else gid)
    except BaseException:
        sock.close()
        raise
    return sock
