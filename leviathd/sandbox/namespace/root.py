"""The fence's root, built in PID 1's own mount namespace: a tmpfs at BASE,
the spec's table mounted into it in order from the pinned sources
(sandbox/namespace/pinner.py), made read-only, then pivot_root into it and
the host's root detached; protected paths are applied last (guard.py)."""

from __future__ import annotations

import os
import posixpath
import stat

from leviathd import resource_defaults
from leviathd.sandbox import guard, scratch
from leviathd.sandbox.namespace.pinner import Pinner, as_user, proc_fd
from leviathd.sandbox.namespace.syscalls import (
    HAVE_MOUNT_SETATTR,
    MNT_DETACH,
    MOUNT_ATTR_NODEV,
    MOUNT_ATTR_NOEXEC,
    MOUNT_ATTR_NOSUID,
    MOUNT_ATTR_RDONLY,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    FenceError,
    mount,
    pivot_root,
    setattr_recursive,
    umount2,
)
from leviathd.sandbox.spec import Mount, SandboxSpec, is_within

# Where the new root is assembled, in our private mount namespace only.
BASE = "/tmp"
_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")


class _Root:
    def __init__(self, spec: SandboxSpec, host_mounts: list[tuple[str, str]] | None) -> None:
        self.spec = spec
        # (mount point, per-mount options) of the host; None: mount_setattr
        # locks each bind's whole tree without it.
        self.host_mounts = host_mounts
        self.mounted: list[str] = []  # targets inside the new root, in order

    def host(self, target: str) -> str:
        return BASE + target if target != "/" else BASE

    def _on_our_tmpfs(self, target: str) -> bool:
        return not any(is_within(target, m) for m in self.mounted)

    def make(self, target: str, *, is_dir: bool) -> None:
        """Create the mount point `target` (and its parents) in the new root."""
        parts = [p for p in target.split("/") if p]
        current = ""
        for i, part in enumerate(parts):
            current += "/" + part
            path = self.host(current)
            last = i == len(parts) - 1
            with as_user(self.spec, not self._on_our_tmpfs(current)):
                try:
                    if last and not is_dir:
                        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_WRONLY
                                         | os.O_CLOEXEC, 0o644))
                    else:
                        os.mkdir(path, 0o755)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise FenceError(f"cannot make mount point {current}: {exc.strerror}") from exc

    def target_fd(self, target: str) -> int:
        """An O_PATH descriptor on the mount point, refused if any part of the
        way there was a link (the kernel would otherwise follow it)."""
        path = self.host(target)
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        real = os.readlink(proc_fd(fd))
        if real != path:
            os.close(fd)
            raise FenceError(f"mount point {target} was redirected to {real}")
        return fd

    def lock_flags(self, target: str, real_source: str, readonly: bool) -> None:
        """Make a bind of `real_source` at `target`, and every mount it
        brought along, nosuid and nodev, and read-only when asked: one
        recursive mount_setattr, which keeps what each mount had already
        (noexec, read-only). Without it (kernel < 5.12), one remount per
        mount, from the host's mount table read once before the build."""
        host = self.host(target)
        if self.host_mounts is None:
            attr = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (MOUNT_ATTR_RDONLY if readonly else 0)
            if setattr_recursive(host, attr):
                return
            raise FenceError("mount_setattr went away while the fence was built")
        flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | (MS_RDONLY if readonly else 0)
        owner = max(
            (p for p in self.host_mounts if is_within(real_source, p[0])),
            key=lambda p: len(p[0]),
            default=("/", ""),
        )
        # Beneath a source of "/" every mount point is; the slice keeps its "/".
        cut = 0 if real_source == "/" else len(real_source)
        points = [(host, owner[1])] + [
            (host.rstrip("/") + point[cut:], options)
            for point, options in self.host_mounts
            if point != real_source and is_within(point, real_source)
        ]
        for point, options in points:
            extra = MS_NOEXEC if "noexec" in options.split(",") else 0
            mount(None, point, None, flags | extra, None)

    def bind(self, m: Mount, src: int) -> None:
        is_dir = stat.S_ISDIR(os.fstat(src).st_mode)
        real = os.readlink(proc_fd(src))
        self.make(m.target, is_dir=is_dir)
        dst = self.target_fd(m.target)
        try:
            mount(proc_fd(src), proc_fd(dst), None, MS_BIND | MS_REC, None)
        finally:
            os.close(dst)
        self.lock_flags(m.target, real, m.readonly)
        self.mounted.append(m.target)

    def overlay(self, m: Mount, fds: list[int]) -> None:
        # The merged folder's top takes the upper folder's owner and mode:
        # give it the lower folder's (upper is root's, beneath root's tmpfs).
        below = os.fstat(fds[0])
        top = os.open(proc_fd(fds[1]), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fchown(top, below.st_uid, below.st_gid)
            os.fchmod(top, stat.S_IMODE(below.st_mode))
        finally:
            os.close(top)
        self.make(m.target, is_dir=True)
        dst = self.target_fd(m.target)
        lower, upper, work = (proc_fd(fd) for fd in fds)
        try:
            mount(
                "overlay",
                proc_fd(dst),
                "overlay",
                MS_NOSUID | MS_NODEV,
                f"lowerdir={lower},upperdir={upper},workdir={work}",
            )
        finally:
            os.close(dst)
        self.mounted.append(m.target)

    def mask(self, m: Mount, null_fd: int) -> None:
        path = self.host(m.target)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            return  # a link resolves inside the new root, where its target is absent
        dst = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if stat.S_ISDIR(st.st_mode):
                mount("tmpfs", proc_fd(dst), "tmpfs",
                      MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=000,size=4k")
            else:
                # /dev/null on a nodev mount: it cannot even be opened.
                mount(proc_fd(null_fd), proc_fd(dst), None, MS_BIND, None)
                mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
                      | MS_NOEXEC, None)
        finally:
            os.close(dst)

    def dev(self, target: str, nodes: dict[str, int]) -> None:
        self.make(target, is_dir=True)
        host = self.host(target)
        mount("tmpfs", host, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
        for name, fd in nodes.items():
            node = f"{host}/{name}"
            os.close(os.open(node, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o666))
            mount(proc_fd(fd), node, None, MS_BIND, None)
            if self.host_mounts is not None:
                mount(None, node, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NOEXEC, None)
        if self.host_mounts is None:
            # Every node at once (devpts and shm, mounted below, have their own).
            setattr_recursive(host, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC)
        os.mkdir(f"{host}/pts", 0o755)
        mount("devpts", f"{host}/pts", "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=620")
        os.symlink("pts/ptmx", f"{host}/ptmx")
        os.mkdir(f"{host}/shm", 0o1777)
        mount("tmpfs", f"{host}/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777{self.size}")
        for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                           ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
            os.symlink(link, f"{host}/{name}")
        mount(None, host, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
        self.mounted.append(target)

    def proc(self, target: str) -> None:
        self.make(target, is_dir=True)
        mount("proc", self.host(target), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        self.mounted.append(target)

    def tmpfs(self, target: str) -> None:
        # The user's own, empty and seen by nothing outside this fence: the
        # private home and working folder of a credential command.
        self.make(target, is_dir=True)
        spec = self.spec
        mount("tmpfs", self.host(target), "tmpfs", MS_NOSUID | MS_NODEV,
              f"mode=700,uid={spec.uid},gid={spec.gid}{self.size or ',size=64m'}")
        self.mounted.append(target)

    @property
    def size(self) -> str:
        """`,size=` of the agent's own tmpfs mounts: from its memory limit."""
        size = resource_defaults.tmpfs_size(self.spec.limits)
        return "" if size is None else f",size={size}"

    def symlink(self, m: Mount) -> None:
        self.make(posixpath.dirname(m.target), is_dir=True)
        os.symlink(m.source, self.host(m.target))


def _mount_table() -> list[tuple[str, str]]:
    """(mount point, per-mount options) of every mount this process sees."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            found.append((fields[4].encode().decode("unicode_escape"), fields[5]))
    return found


def build_root(spec: SandboxSpec, workdir_fd: int | None = None) -> None:
    # Pin every source (and the device nodes) while the host's view is still
    # in place: the base tmpfs below covers the host's /tmp in this namespace.
    nodes = {name: os.open(f"/dev/{name}", os.O_PATH | os.O_CLOEXEC) for name in _DEV_NODES}
    scratch_root = scratch.open_mounted(spec)
    if scratch_root is None:
        raise FenceError(f"the scratch tmpfs is not mounted on {spec.scratch}")
    pin = Pinner(spec, scratch_root, workdir_fd)
    pins: dict[int, list[int]] = {}
    try:
        for i, m in enumerate(spec.mounts):
            if m.kind == "bind":
                pins[i] = [pin.source(m)]
            elif m.kind == "overlay":
                pins[i] = [pin.source(m), pin.layer(m.upper), pin.layer(m.work)]
    finally:
        os.close(scratch_root)
    root = _Root(spec, None if HAVE_MOUNT_SETATTR else _mount_table())
    mount("tmpfs", BASE, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    for i, m in enumerate(spec.mounts):
        if m.kind == "bind":
            if pins[i][0] >= 0:  # else an entry gone since (MountRole.ENTRY)
                root.bind(m, pins[i][0])
        elif m.kind == "overlay":
            root.overlay(m, pins[i])
        elif m.kind == "proc":
            root.proc(m.target)
        elif m.kind == "dev":
            root.dev(m.target, nodes)
        elif m.kind == "tmpfs":
            root.tmpfs(m.target)
        elif m.kind == "symlink":
            root.symlink(m)
        elif m.kind == "mask":
            root.mask(m, nodes["null"])
        elif m.kind == "protect":
            pass  # in the finished view, below
        else:
            raise FenceError(f"unknown mount kind {m.kind!r}")
    for fds in pins.values():
        for fd in fds:
            if fd >= 0:
                os.close(fd)
    for fd in nodes.values():
        os.close(fd)
    # Mount points for the workdir's parents were made on the root tmpfs; from
    # now on nothing may write there.
    mount(None, BASE, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=755")
    os.chdir(BASE)
    pivot_root(".", ".")
    # The old root is stacked on the new one; detach it, and with it the host.
    umount2(".", MNT_DETACH)
    os.chdir("/")
    # Last, where links resolve as the agent will see them.
    guard.apply(spec)
