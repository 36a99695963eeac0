"""The root an agent's container engine runs in: the agent's own fence's,
plus what only the engine needs (issue 43).

The engine's launcher (enginesock/rootless_exec.py) enters the mount
namespace of the agent's running fence, so every file the engine, conmon,
the runtime, a build or a RUN step can reach is one the agent's fence shows,
at the access the fence gives it: a bind of the workdir carries its
read-only `.git/config`, buildah's `/var/tmp` is the agent's `/tmp`, and
the host's `/`, the hidden paths of the home, `/run/user/<uid>`, another
user's files and the daemon's folders are simply not there. Nothing is
listed twice: the fence's table is what the fence built.

The fence's root is a read-only tmpfs of mount points, so the engine's own
entries cannot be added to it. The launcher builds a new root instead, on a
tmpfs of its own: every top-level entry of the fence's root moved across
whole (each a recursive clone, its mounts' flags kept), then what the engine
alone gets:

- `/.leviath-engine/run` and `/.leviath-engine/storage`: its runtime folder
  and storage (enginesock/rootless.py), from the machine's view;
- `newuidmap` and `newgidmap` from the machine's view, over the fence's
  (which are nosuid, as every bind of the fence is);
- a `/dev` of its own (the fence's nodes, and /dev/fuse and /dev/net/tun
  where the machine has them), a fresh `/proc` of its own PID namespace,
  and a read-only `/sys` (the runtime needs one to mount a container's)
  with the machine's control groups on /sys/fs/cgroup (the runtime looks
  for their mounts even where it makes no group);
- `/var/tmp`: the fence's `/tmp` again.

Sources from the machine's view are cloned (open_tree) before the launcher
leaves it and attached (move_mount) after; a clone carries nothing the
agent can change.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
from dataclasses import dataclass

from leviathd.sandbox.namespace import syscalls

SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429  # the same on every architecture since 5.2
OPEN_TREE_CLONE, AT_RECURSIVE, AT_SYMLINK_NOFOLLOW = 0x1, 0x8000, 0x100
MOVE_MOUNT_F_EMPTY_PATH = 0x4
AT_FDCWD = -100
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_SLAVE = 0x20, 0x1000, 0x4000, 0x80000
MNT_DETACH = 2

ENGINE_DIR = "/.leviath-engine"
RUN = f"{ENGINE_DIR}/run"
STORAGE = f"{ENGINE_DIR}/storage"
# The fence's own minimal /dev has these; the engine gets them from the machine.
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_EXTRA = ("fuse", "net/tun")
# The runtime finds the control groups' mounts there, even where it makes none.
CGROUP = "/sys/fs/cgroup"
ID_MAPPERS = ("newuidmap", "newgidmap")
# Replaced, never carried over: the engine's own.
OWN_TOP = ("proc", "dev", "sys", ENGINE_DIR.lstrip("/"))

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enc(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None) -> None:
    enc = _enc
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags),
                       enc(data)), f"mount {fstype or 'bind'} on {target}")


def clone(path: str, *, recursive: bool = True) -> int:
    """A detached copy of the mount tree at `path` (not following a last
    link), as a descriptor."""
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC | AT_SYMLINK_NOFOLLOW | (AT_RECURSIVE if recursive
                                                                   else 0)
    fd = _libc.syscall(ctypes.c_long(SYS_OPEN_TREE), ctypes.c_int(AT_FDCWD),
                       os.fsencode(path), ctypes.c_uint(flags))
    _check(fd, f"open_tree {path}")
    return int(fd)


def attach(fd: int, target: str) -> None:
    rc = _libc.syscall(ctypes.c_long(SYS_MOVE_MOUNT), ctypes.c_int(fd), b"",
                       ctypes.c_int(AT_FDCWD), os.fsencode(target),
                       ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH))
    _check(rc, f"move_mount onto {target}")


@dataclass
class MachineParts:
    """What the engine gets from the machine's view: clones, by name."""
    run: int
    storage: int
    mappers: dict[str, int]  # the path of newuidmap/newgidmap -> its clone
    dev: dict[str, int]
    cgroup: int | None
    # A container agent's fence is its image: the engine's programs are the
    # machine's (top-level name -> its clone, or a link's target).
    system: dict[str, int | str]

    def close(self) -> None:
        for fd in (self.run, self.storage, *self.mappers.values(), *self.dev.values(),
                   *([] if self.cgroup is None else [self.cgroup]),
                   *(x for x in self.system.values() if isinstance(x, int))):
            with contextlib.suppress(OSError):
                os.close(fd)


def system_parts(system: list[str]) -> dict[str, int | str]:
    """The top-level `system` folders (`/usr`, ...) by name: a clone of each
    folder, the target of each link (`/bin` -> usr/bin); what is absent is
    left out."""
    taken: dict[str, int | str] = {}
    for path in system:
        name = path.strip("/")
        if "/" in name or not name:
            continue
        with contextlib.suppress(FileNotFoundError):
            taken[name] = os.readlink(path) if os.path.islink(path) else clone(path)
    return taken


def machine_parts(run: str, storage: str, mappers: list[str],
                  system: list[str]) -> MachineParts:
    """Clones of the engine's folders, the id mappers and the device nodes,
    and of the `system` folders (top-level, read-only), taken in the
    machine's view (before the launcher enters the agent's)."""
    taken = system_parts(system)
    dev: dict[str, int] = {}
    for name in (*DEV_NODES, *DEV_EXTRA):
        path = f"/dev/{name}"
        with contextlib.suppress(OSError):
            if stat.S_ISCHR(os.stat(path, follow_symlinks=False).st_mode):
                dev[name] = clone(path, recursive=False)
    cgroup = None
    with contextlib.suppress(OSError):
        cgroup = clone(CGROUP)
    return MachineParts(clone(run), clone(storage),
                        {p: clone(p, recursive=False) for p in mappers}, dev, cgroup, taken)


def _place(src_is_dir: bool, target: str) -> None:
    if src_is_dir:
        os.makedirs(target, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW,
                         0o644))


def _dev(new: str, parts: MachineParts) -> None:
    dev = f"{new}/dev"
    os.mkdir(dev, 0o755)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
    for name, fd in parts.dev.items():
        _place(False, f"{dev}/{name}")
        attach(fd, f"{dev}/{name}")
    os.mkdir(f"{dev}/pts", 0o755)
    mount("devpts", f"{dev}/pts", "devpts", MS_NOSUID | MS_NOEXEC,
          "newinstance,ptmxmode=0666,mode=620")
    os.symlink("pts/ptmx", f"{dev}/ptmx")
    os.mkdir(f"{dev}/shm", 0o1777)
    mount("tmpfs", f"{dev}/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m")
    for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                       ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(link, f"{dev}/{name}")


def build(parts: MachineParts) -> None:
    """In a mount namespace of its own, entered from the agent's fence's (so
    `/` is the fence's root), and as PID 1 of a PID namespace of its own:
    the engine's root, as the module's docstring says, made the root."""
    mount(None, "/", None, MS_REC | MS_SLAVE, None)
    entries: list[tuple[str, int | str, bool]] = []  # name, clone or link, is a folder
    entries += [(name, what, True) for name, what in parts.system.items()]
    for entry in os.scandir("/"):
        if entry.name in OWN_TOP or entry.name in parts.system:
            continue
        if entry.is_symlink():
            entries.append((entry.name, os.readlink(entry.path), False))
        else:
            entries.append((entry.name, clone(entry.path), entry.is_dir(follow_symlinks=False)))
    tmp = clone("/tmp") if any(e[0] == "tmp" for e in entries) else None
    # The fence's /proc is replaced anyway: the new root is built on it.
    new = "/proc"
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=64k")
    for name, what, is_dir in entries:
        target = f"{new}/{name}"
        if isinstance(what, str):
            os.symlink(what, target)
            continue
        _place(is_dir, target)
        attach(what, target)
        if name not in parts.system:
            os.close(what)
    for path, fd in parts.mappers.items():
        # Only over the fence's own copy (the system it shows); nothing new.
        if os.path.exists(new + path):
            attach(fd, new + path)
    if tmp is not None and not any(e[0] == "var" for e in entries):
        _place(True, f"{new}/var/tmp")
        attach(tmp, f"{new}/var/tmp")
    for folder, fd in ((RUN, parts.run), (STORAGE, parts.storage)):
        _place(True, new + folder)
        attach(fd, new + folder)
    _dev(new, parts)
    os.mkdir(f"{new}/proc", 0o555)
    os.mkdir(f"{new}/sys", 0o555)
    os.chdir(new)
    syscalls.pivot_root(".", ".")
    _check(_libc.umount2(b".", MNT_DETACH), "umount the fence's root")
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=755,size=64k")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    mount("sysfs", "/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    if parts.cgroup is not None:
        attach(parts.cgroup, CGROUP)
