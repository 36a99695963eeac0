"""A folder pinned by a descriptor, made a path that no user can change, for
a process that only takes paths (a container engine's --mount).

The workdir is opened once, as the user (sandbox/supervisor.py); a container engine given
the workdir's *path* would resolve it again, as root, when the user may have
swapped a part of it for a link. `bind_pinned` bind-mounts the pinned folder
itself at `<folder>/<name>`, `<folder>` being root's (0700) all the way from /,
so the engine resolves a path that only root could change. Call it in the
daemon's own mount namespace (where the descriptor's mount lives: the kernel
refuses a bind from another namespace's mount), and `release` when the
container is gone.
"""

from __future__ import annotations

import contextlib
import os
import stat

from leviathd import fsat
from leviathd.errors import Unavailable
from leviathd.sandbox.namespace.syscalls import (
    MNT_DETACH,
    MS_BIND,
    MS_REC,
    FenceError,
    mount,
    umount2,
)

_UMOUNT_NOFOLLOW = 8


def _root_folder(folder: str) -> int:
    fd = fsat.open_dir(folder, create_mode=0o700)
    st = os.fstat(fd)
    if st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o077:
        os.close(fd)
        raise Unavailable(f"{folder} must be root's alone (0700) to hold pinned folders")
    return fd


def bind_pinned(pinned: str, folder: str, name: str, *, expect: str) -> str:
    """Bind the folder behind the descriptor path `pinned` (e.g.
    spawn.Held.workdir_path(), "/proc/<pid>/fd/<n>") at `<folder>/<name>` and
    return that path. `expect`: the real path the checks were made on; the
    pinned folder must still be it."""
    src = os.open(pinned, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        real = os.readlink(f"/proc/self/fd/{src}")
        if real != expect:
            raise Unavailable(f"the pinned folder is {real}, not {expect}")
        dfd = _root_folder(folder)
        try:
            fsat.mkdir_at(dfd, name, 0o700, exist_ok=True)
            dst = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=dfd)  # fmt: skip
            try:
                mount(f"/proc/self/fd/{src}", f"/proc/self/fd/{dst}", None, MS_BIND | MS_REC,
                      None)  # fmt: skip
            except FenceError as exc:
                raise Unavailable(f"cannot pin {expect} at {folder}/{name}: {exc}") from exc
            finally:
                os.close(dst)
        finally:
            os.close(dfd)
    finally:
        os.close(src)
    return os.path.join(folder, name)


def release(folder: str) -> None:
    """Detach every pinned folder in `folder` and remove it."""
    try:
        dfd = fsat.open_dir(folder)
    except FileNotFoundError:
        return
    try:
        for name in os.listdir(dfd):
            with contextlib.suppress(FenceError):
                umount2(os.path.join(folder, name), MNT_DETACH | _UMOUNT_NOFOLLOW)
            fsat.rmdir_at(dfd, name)
    finally:
        os.close(dfd)
    parent, base = os.path.split(folder.rstrip("/"))
    pfd = fsat.open_dir(parent)
    try:
        fsat.rmdir_at(pfd, base)
    finally:
        os.close(pfd)
