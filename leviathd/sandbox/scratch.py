"""An execution's scratch folder on disk: its home, its /tmp, its throwaway layers.

Layout: `<scratch_dir>/` is root's (0711: a user can reach their own folder
by name but list nobody's), `<scratch_dir>/<execution>/` is the user's (0700).
Everything is made while still root's and handed over last, so the user's
other processes cannot plant links while root is working in it. Removal walks
by file descriptor (shutil.rmtree's fd-based walk on Linux) and so never
follows a link an agent left behind.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shutil
import stat
from collections.abc import Collection

from leviathd.errors import Unavailable
from leviathd.sandbox.spec import SandboxSpec

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _ensure_root_dir(path: str) -> None:
    """`path` exists as a real folder owned by root with mode 0711, parents too."""
    parent = posixpath.dirname(path)
    if parent != path and not os.path.isdir(parent):
        os.makedirs(parent, mode=0o755, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o711)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise Unavailable(f"scratch folder {path} is not a folder")
    if st.st_uid != 0:
        raise Unavailable(f"scratch folder {path} is not owned by root")
    if stat.S_IMODE(st.st_mode) & 0o066:
        os.chmod(path, 0o711)


def create(spec: SandboxSpec) -> str:
    """Make the execution's scratch folder (idempotent for a folder this
    process made before); returns its path."""
    root = posixpath.dirname(spec.scratch)
    _ensure_root_dir(root)
    try:
        os.mkdir(spec.scratch, 0o700)
    except FileExistsError:
        st = os.lstat(spec.scratch)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != spec.uid:
            raise Unavailable(
                f"scratch folder {spec.scratch} exists and is not this agent's"
            ) from None
        return spec.scratch
    try:
        dfd = os.open(spec.scratch, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for name in ("home", "tmp"):
                os.mkdir(name, 0o700, dir_fd=dfd)
                os.chown(name, spec.uid, spec.gid, dir_fd=dfd, follow_symlinks=False)
            for mount in spec.mounts:
                if mount.kind != "overlay":
                    continue
                layer = posixpath.dirname(mount.upper)
                os.makedirs(layer, 0o700, exist_ok=True)
                # The merged folder's top takes the upper folder's owner and mode,
                # so give it the lower folder's.
                lower = os.stat(mount.source)
                os.mkdir(mount.upper, 0o700)
                os.chown(mount.upper, lower.st_uid, lower.st_gid)
                os.chmod(mount.upper, stat.S_IMODE(lower.st_mode))
                os.mkdir(mount.work, 0o700)
            os.fchown(dfd, spec.uid, spec.gid)
        finally:
            os.close(dfd)
    except OSError as exc:
        remove(spec.scratch)
        raise Unavailable(f"cannot make scratch folder {spec.scratch}: {exc}") from exc
    return spec.scratch


def _mounts_under(path: str) -> list[str]:
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                target = line.split()[4].replace("\\040", " ")
                if posixpath.normpath(target) == path or target.startswith(path + "/"):
                    found.append(target)
    except OSError:
        pass
    return found


def remove(path: str) -> bool:
    """Remove one scratch folder; False if it was not there. Never follows a
    link, never unmounts: a mount left beneath it is an error to look at."""
    path = posixpath.normpath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return True
    mounted = _mounts_under(path)
    if mounted:
        raise Unavailable(f"scratch folder {path} still has mounts under it: {mounted}")
    if not shutil.rmtree.avoids_symlink_attacks:
        raise Unavailable("this platform cannot remove folders without following links")
    # root walks past any mode an agent set; the walk is by fd, never by link.
    shutil.rmtree(path)
    return True


def sweep(scratch_dir: str, live: Collection[str]) -> list[str]:
    """Remove the folders of executions not in `live`; returns what went.
    Names that are not execution ids are left alone."""
    removed = []
    try:
        names = os.listdir(scratch_dir)
    except FileNotFoundError:
        return []
    for name in sorted(names):
        if name in live or not _ID.match(name):
            continue
        if remove(posixpath.join(scratch_dir, name)):
            removed.append(name)
    return removed
