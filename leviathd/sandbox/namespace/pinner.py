"""The fence's pinner: every source of the spec's table opened (O_PATH) and
checked before anything is mounted, so what is mounted is what was checked
(sandbox/namespace/root.py mounts from these descriptors)."""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
from collections.abc import Iterator

from leviathd import fsids
from leviathd.errors import Unavailable
from leviathd.sandbox import scratch
from leviathd.sandbox.namespace.syscalls import FenceError
from leviathd.sandbox.spec import (
    SYSTEM_DIRS,
    SYSTEM_LINK_DIRS,
    Mount,
    MountRole,
    SandboxSpec,
    is_within,
)

fsids.preload()


def proc_fd(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


class Pinner:
    """O_PATH descriptors for every source, checked: mounting from the
    descriptor means a link swapped in after the check cannot change what
    gets mounted.

    - Scratch folders are opened beneath the root of the scratch tmpfs, one
      component at a time, never through a link (no user can reach them).
    - The workdir must be the very folder the user's own open gave (sandbox/supervisor.py).
    - The system folders are opened as root; everything else with the
      user's file-system ids: a bind made by root would otherwise carry the
      user past folders they cannot enter (a link from ~/.cache/pip into a
      0700 folder of someone else's).
    Every source outside scratch must really be the path the spec was computed
    for (its masks were), must not lie inside a hidden path, and a workdir or
    git folder must not hold a home."""

    def __init__(self, spec: SandboxSpec, scratch_root: int, workdir_fd: int | None) -> None:
        self.spec = spec
        self.scratch_root = scratch_root
        self.workdir_fd = workdir_fd

    def layer(self, path: str) -> int:
        return self._beneath_scratch(path, os.O_PATH | os.O_DIRECTORY)

    def _beneath_scratch(self, path: str, flags: int) -> int:
        rel = posixpath.relpath(path, self.spec.scratch)
        try:
            return scratch.open_beneath(self.scratch_root, rel, flags)
        except (OSError, Unavailable) as exc:
            raise FenceError(f"cannot open {path} in scratch: {exc}") from exc

    def source(self, m: Mount) -> int:
        """The pinned source; -1 for a folder's entry (MountRole.ENTRY) that
        is gone since the spec was built (its folder's tool removed it)."""
        spec = self.spec
        if is_within(m.source, spec.scratch):
            return self._beneath_scratch(m.source, os.O_PATH)
        try:
            fd = self._open(m.source, exact=m.exact)
        except FenceError as exc:
            if m.role == MountRole.ENTRY and isinstance(exc.__cause__, FileNotFoundError):
                return -1
            raise
        try:
            if (self.workdir_fd is not None and m.target == spec.workdir
                    and m.role == MountRole.WORKDIR):
                self._same_as_pinned(fd, m.source)
            self._check(fd, m)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _same_as_pinned(self, fd: int, path: str) -> None:
        """The pinned workdir lives in the daemon's mount namespace, which the
        kernel will not bind from here; so the workdir is opened again and
        must be that very folder (a folder has one inode, and no user can
        make a mount)."""
        assert self.workdir_fd is not None
        now, pinned = os.fstat(fd), os.fstat(self.workdir_fd)
        if (now.st_dev, now.st_ino) != (pinned.st_dev, pinned.st_ino):
            raise FenceError(f"the workdir {path} was replaced while the agent was starting")

    def _open(self, path: str, *, exact: bool) -> int:
        spec = self.spec
        flags = os.O_PATH | os.O_CLOEXEC | (os.O_NOFOLLOW if exact else 0)
        by_user = not any(is_within(path, system) for system in SYSTEM_DIRS + SYSTEM_LINK_DIRS)
        try:
            with as_user(spec, by_user):
                return os.open(path, flags)
        except OSError as exc:
            who = f"uid {spec.uid}" if by_user else "root"
            raise FenceError(f"cannot open {path} (as {who}): {exc.strerror}") from exc

    def _check(self, fd: int, m: Mount) -> None:
        spec = self.spec
        real = os.readlink(proc_fd(fd))
        if real != m.source:
            raise FenceError(f"{m.source} changed while the agent was starting (it is now {real})")
        if not m.exact:
            for hidden in spec.hidden:
                if is_within(real, hidden):
                    raise FenceError(f"{m.source} leads to {real}, inside the hidden path {hidden}")
        if m.role in (MountRole.WORKDIR, MountRole.WORKTREE_GIT) and (
            real == "/" or is_within(spec.home, real)
        ):
            raise FenceError(f"{real} would show the whole home folder")
        if m.role == MountRole.WORKTREE_GIT:
            self._check_git_folder(fd, real)

    def _check_git_folder(self, fd: int, real: str) -> None:
        """What the spec believed of a main git folder, checked again on the
        folder that will be mounted, as the user."""
        with as_user(self.spec, True):
            for name, want in (("HEAD", stat.S_ISREG), ("objects", stat.S_ISDIR),
                               ("refs", stat.S_ISDIR)):  # fmt: skip
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError as exc:
                    why = f"{name}: {exc.strerror}"
                    raise FenceError(f"{real} is not a git folder ({why})") from exc
                if not want(st.st_mode):
                    raise FenceError(f"{real} is not a git folder ({name})")


@contextlib.contextmanager
def as_user(spec: SandboxSpec, active: bool) -> Iterator[None]:
    """Make files with the user's file-system ids, so links planted in the
    user's own folders only reach what the user could reach anyway."""
    if not active:
        yield
        return
    with fsids.as_user(spec.uid, spec.gid):
        yield
