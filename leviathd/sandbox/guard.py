"""Apply a spec's `protect` mounts in the agent's finished view.

Both kinds run the same code: the namespace launcher in its PID 1 once the
root is pivoted, the container kind in a helper that joins the container's
mount namespace (`python -m leviathd.sandbox.guard PID`, the spec as JSON on
stdin) once the container runs and before any agent command does. Paths
resolve in the agent's view, links included: whatever a link reaches there,
the agent could reach anyway, and covering it read-only only takes rights
away. A missing entry is made with the user's file-system ids, so nothing
is created that the user could not have created.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import posixpath
import stat
import subprocess
import sys

from leviathd import fsids
from leviathd.sandbox.protected import initial_content
from leviathd.sandbox.spec import Mount, SandboxSpec

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
CLONE_NEWNS = 0x00020000

_MAX_LINKS = 8

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]


fsids.preload()

class GuardError(Exception):
    """A protected path could not be protected: the agent must not start."""


def _mount(source: str | None, target: str, flags: int) -> None:
    src = None if source is None else os.fsencode(source)
    if _libc.mount(src, os.fsencode(target), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise GuardError(f"cannot protect {target}: {os.strerror(err)}")


def _as_user(spec: SandboxSpec) -> contextlib.AbstractContextManager[None]:
    return fsids.as_user(spec.uid, spec.gid)


def apply(spec: SandboxSpec) -> None:
    """Every `protect` mount of `spec`, in table order (parents first), in
    this process's mount namespace, which must be the agent's."""
    for m in spec.mounts:
        if m.kind == "protect":
            _protect(spec, m)


def _find(spec: SandboxSpec, m: Mount) -> str | None:
    """Where `m.target` leads in the agent's view, made first when it is
    missing and read-only; None for a pin of something that is gone. A
    dangling link is followed to where it leads."""
    path = m.target
    for _ in range(_MAX_LINKS):
        with _as_user(spec):
            found = os.path.exists(path)
        if found:
            return os.path.realpath(path)
        if not m.readonly:
            return None
        if os.path.islink(path):
            path = posixpath.normpath(posixpath.join(posixpath.dirname(path), os.readlink(path)))
            continue
        if not _create(spec, path, folder=m.source == "dir"):
            return None
    raise GuardError(f"cannot protect {m.target}: too many links, or it keeps vanishing")


def _create(spec: SandboxSpec, path: str, *, folder: bool) -> bool:
    """Make a missing protected entry empty, as the user: a folder, or a file
    (`{}` for JSON, which its tool then reads as no settings; see
    protected.initial_content). False when the
    user may not create it (a read-only file system, a folder not theirs):
    then the agent, the same user, cannot either."""
    parent, name = posixpath.split(path)
    try:
        with _as_user(spec):
            os.makedirs(parent, 0o755, exist_ok=True)
            if folder:
                os.mkdir(path, 0o755)
                return True
            dfd = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o644, dir_fd=dfd)  # fmt: skip
            finally:
                os.close(dfd)
            try:
                os.write(fd, initial_content(name))
            finally:
                os.close(fd)
    except FileExistsError:
        return True  # made meanwhile, or a link: the caller looks again
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return False
        raise GuardError(f"cannot make {path} to protect it: {exc.strerror}") from exc
    return True


def _protect(spec: SandboxSpec, m: Mount) -> None:
    # By path: nothing of the agent runs yet, and whatever a path reaches in
    # this view the agent could reach anyway; covering it only takes rights away.
    path = _find(spec, m)
    if path is None:
        return
    try:
        st = os.stat(path)
        noexec = os.statvfs(path).f_flag & os.ST_NOEXEC
    except OSError as exc:
        raise GuardError(f"cannot protect {m.target}: {exc.strerror}") from exc
    # (whatever it is: a device or a fifo bound read-only is as harmless)
    _mount(path, path, MS_BIND | (MS_REC if stat.S_ISDIR(st.st_mode) else 0))
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | (MS_NOEXEC if noexec else 0)
    _mount(None, path, flags | (MS_RDONLY if m.readonly else 0))


def apply_in(pid: int, spec: SandboxSpec, timeout: float = 60.0) -> None:
    """Apply the spec's `protect` mounts in the mount namespace of process
    `pid` (a container's init), from a helper process: joining a mount
    namespace needs a single thread, and the daemon has several."""
    if not any(m.kind == "protect" for m in spec.mounts):
        return
    try:
        done = subprocess.run(
            [sys.executable, "-m", "leviathd.sandbox.guard", str(pid)],
            input=json.dumps(spec.to_dict()),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GuardError(f"cannot protect the agent's files: {exc}") from None
    if done.returncode != 0:
        raise GuardError((done.stderr.strip() or f"status {done.returncode}")[-2000:])


def main(argv: list[str]) -> int:
    """Join the mount namespace of process `argv[0]` (a container's init) and
    apply the spec read from stdin. Everything is imported before the join:
    afterwards this process sees the container's files, not the host's."""
    spec = SandboxSpec.from_dict(json.loads(sys.stdin.read(1 << 22)))
    pid = int(argv[0])
    ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _libc.setns(ns, CLONE_NEWNS) != 0:
            err = os.strerror(ctypes.get_errno())
            print(f"cannot join the container's mounts: {err}", file=sys.stderr)
            return 1
        # The namespace's root need not be the container's (it pivoted): take the init's.
        os.fchdir(root)
        os.chroot(".")
        os.chdir("/")
    finally:
        os.close(ns)
        os.close(root)
    try:
        apply(spec)
    except (GuardError, OSError) as exc:
        print(str(exc)[:2000], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
