"""The runner that copies images between an agent's engine storage and its
user's image store (enginesock/imagestore.py), run by the daemon as `python
-m leviathd.enginesock.imagestore_exec`, as root, orders on stdin, one JSON
line of result on stdout.

Both storages are the user's to write: an agent's engine could leave a link
in its storage pointing anywhere the user may read (a hidden folder of the
home, another user's file the user may read). So the copy runs as the user
in a root of its own with nothing of the user's in it: the machine's system
folders, read-only, the agent's storage at the path its engine had
(/.leviath-engine/storage, so libpod's database agrees), the store, and
empty tmpfs runtime folders. A link in either storage leads nowhere the
agent could not already read. Its PID namespace ends with it, and with it
rootless podman's pause process; it has a network namespace with nothing
in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from typing import Any

from leviathd import fsat
from leviathd.enginesock import engineroot
from leviathd.sandbox.namespace import syscalls

CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG = 1
MAX_ORDERS = 64 * 1024
MAX_IMAGES = 1000
WORK = "/run/leviath-work"
# In the store's folder: transient state, cleared before each use.
STORE_TRANSIENT = ("run", "libpod-tmp", "tmp")
STEP_TIMEOUT = 1800.0
MAX_OUTPUT = 4 << 20


def _tmpfs(path: str, uid: int, gid: int) -> None:
    os.makedirs(path, 0o755, exist_ok=True)  # (/run is a tmpfs; the rest was made before)
    engineroot.mount("tmpfs", path, "tmpfs", engineroot.MS_NOSUID | engineroot.MS_NODEV,
                     f"mode=700,uid={uid},gid={gid},size=64m")


def store_flags(store: str) -> list[str]:
    """The store's places for podman, all in its folder and at the path the
    machine shows: libpod's database records them, so its user can list and
    prune it outside any agent with the same flags (docs/containers.md)."""
    return ["--root", f"{store}/storage", "--runroot", f"{store}/run",
            "--tmpdir", f"{store}/libpod-tmp", "--volumepath", f"{store}/volumes"]


def build_root(system: dict[str, int | str], dev: dict[str, int], storage: int, store: int,
               store_path: str, uid: int, gid: int) -> None:
    """As PID 1 of a new PID and mount namespace: the root the module's
    docstring names, made the root."""
    m = engineroot
    m.mount(None, "/", None, m.MS_REC | m.MS_SLAVE, None)
    new = "/tmp"
    m.mount("tmpfs", new, "tmpfs", m.MS_NOSUID | m.MS_NODEV, "mode=755,size=64k")
    for name, what in system.items():
        target = f"{new}/{name}"
        if isinstance(what, str):
            os.symlink(what, target)
            continue
        os.mkdir(target, 0o755)
        m.attach(what, target)
        os.close(what)
        # Read-only whatever the machine's mount says.
        m.mount(None, target, None, m.MS_REMOUNT | m.MS_BIND | m.MS_RDONLY, None)
    for folder, fd in ((m.STORAGE, storage), (store_path, store)):
        os.makedirs(new + folder, 0o755, exist_ok=True)
        m.attach(fd, new + folder)
        os.close(fd)
    os.mkdir(f"{new}/dev", 0o755)
    m.mount("tmpfs", f"{new}/dev", "tmpfs", m.MS_NOSUID | m.MS_NOEXEC, "mode=755,size=64k")
    for name, fd in dev.items():
        os.close(os.open(f"{new}/dev/{name}", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        m.attach(fd, f"{new}/dev/{name}")
        os.close(fd)
    # libpod's locks are shared memory.
    os.mkdir(f"{new}/dev/shm", 0o1777)
    m.mount("tmpfs", f"{new}/dev/shm", "tmpfs", m.MS_NOSUID | m.MS_NODEV, "mode=1777,size=64m")
    for name in ("proc", "sys", "tmp", "run", "var"):
        os.makedirs(f"{new}/{name}", 0o755, exist_ok=True)  # var: the store may be below
    os.mkdir(new + m.RUN, 0o755)
    # Copies of big layers go through a temporary file (c/image: TMPDIR or
    # /var/tmp): on the store's disk, not a small tmpfs.
    os.symlink(f"{store_path}/tmp", f"{new}/var/tmp")
    os.chdir(new)
    syscalls.pivot_root(".", ".")
    m._check(m._libc.umount2(b".", m.MNT_DETACH), "umount the machine's root")
    os.chdir("/")
    m.mount(None, "/", None, m.MS_REMOUNT | m.MS_RDONLY | m.MS_NOSUID | m.MS_NODEV,
            "mode=755,size=64k")
    m.mount("proc", "/proc", "proc", m.MS_NOSUID | m.MS_NODEV | m.MS_NOEXEC, None)
    m.mount("tmpfs", "/tmp", "tmpfs", m.MS_NOSUID | m.MS_NODEV, "mode=1777,size=64m")
    m.mount("tmpfs", "/run", "tmpfs", m.MS_NOSUID | m.MS_NODEV, "mode=755,size=64m")
    m.mount("sysfs", "/sys", "sysfs", m.MS_RDONLY | m.MS_NOSUID | m.MS_NODEV | m.MS_NOEXEC, None)
    for path in (WORK, m.RUN):
        _tmpfs(path, uid, gid)


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=False,
                          stdin=subprocess.DEVNULL, timeout=STEP_TIMEOUT)


def _images(argv: list[str], env: dict[str, str]) -> list[dict[str, Any]]:
    r = _run([*argv, "images", "--format", "json"], env)
    if r.returncode != 0:
        raise OSError(f"podman images: {r.stderr.strip()[-500:]}")
    got = json.loads(r.stdout[:MAX_OUTPUT] or "[]")
    return [x for x in got if isinstance(x, dict)][:MAX_IMAGES] if isinstance(got, list) else []


# An image reference as podman writes one (registry/path:tag); a storage an
# agent's engine wrote could hold anything, and a name is an argument.
_NAME = re.compile(r"[a-z0-9][A-Za-z0-9._/:@-]{0,254}")


def _names(image: dict[str, Any]) -> list[str]:
    return [n for n in image.get("Names") or [] if isinstance(n, str) and _NAME.fullmatch(n)]


def _driver(argv: list[str], env: dict[str, str]) -> str:
    r = _run([*argv, "info", "--format", "{{.Store.GraphDriverName}}"], env)
    driver = r.stdout.strip()
    if r.returncode != 0 or not driver.isalnum():
        raise OSError(f"podman info: {r.stderr.strip()[-500:]}")
    return driver


def _copy(src: list[str], names: list[str], dest: str, env: dict[str, str]) -> list[str]:
    """Each name pushed from `src`'s storage into the storage `dest` names
    (containers-storage:[driver@root+runroot]); the names that went."""
    done = []
    for name in names:
        r = _run([*src, "push", "--quiet", name, f"containers-storage:{dest}{name}"], env)
        if r.returncode == 0:
            done.append(name)
        else:
            sys.stderr.write(f"{name}: {r.stderr.strip()[-300:]}\n")
    return done


def _prune(store: list[str], env: dict[str, str], max_bytes: int) -> list[str]:
    """The store's oldest images removed until the rest's sizes add up to
    `max_bytes` or less (layers two images share count twice: it prunes
    early, never late)."""
    images = sorted(_images(store, env), key=lambda x: int(x.get("Created") or 0))
    total = sum(int(x.get("Size") or 0) for x in images)
    gone: list[str] = []
    for image in images:
        if total <= max_bytes:
            break
        r = _run([*store, "rmi", "--force", str(image.get("Id", ""))], env)
        if r.returncode == 0:
            total -= int(image.get("Size") or 0)
            gone += _names(image) or [str(image.get("Id", ""))[:12]]
    _run([*store, "image", "prune", "--force"], env)
    return gone


def _clear(store: str) -> None:
    """What the last copy left in the store's transient folders (a stale
    pause.pid names a process of another PID namespace)."""
    fd = fsat.open_dir(store)
    try:
        for name in STORE_TRANSIENT:
            fsat.remove_tree_at(fd, name)
    finally:
        os.close(fd)


def work(orders: dict[str, Any]) -> dict[str, Any]:
    """As the user, in the root build_root made: the order's copies."""
    podman = str(orders["podman"])
    env = {"PATH": str(orders["path"]), "HOME": WORK, "XDG_RUNTIME_DIR": WORK,
           "USER": str(orders["user"]), "LOGNAME": str(orders["user"]),
           "TMPDIR": f"{orders['store']}/tmp"}
    _clear(str(orders["store"]))
    os.mkdir(f"{orders['store']}/tmp", 0o700)
    common = ["--cgroup-manager", "cgroupfs", "--events-backend", "none", "--log-level", "error"]
    place = str(orders["store"])
    store = [podman, *store_flags(place), *common]
    agent = [podman, *[str(a) for a in orders["agent_flags"]], *common]
    out: dict[str, Any] = {}
    if orders["mode"] == "save":
        driver = _driver(agent, env)
        names = [n for image in _images(agent, env) for n in _names(image)]
        out["saved"] = _copy(agent, names, f"[{driver}@{place}/storage+{place}/run]",
                             env)
        out["pruned"] = _prune(store, env, int(orders["max"]))
    else:
        names = [n for image in _images(store, env) for n in _names(image)]
        if names:
            driver = _driver(store, env)
            out["seeded"] = _copy(store, names, f"[{driver}@{engineroot.STORAGE}/storage+"
                                  f"{engineroot.RUN}/containers]", env)
        else:
            out["seeded"] = []
    _clear(place)
    return out


def main() -> int:
    raw = sys.stdin.buffer.readline(MAX_ORDERS)
    if not raw.endswith(b"\n"):
        return 2
    orders = json.loads(raw)
    uid, gid = int(orders["uid"]), int(orders["gid"])
    if uid == 0 or gid == 0:
        return 2
    # The machine's view (the daemon's own is narrowed by its unit).
    ns = os.open("/proc/1/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if engineroot._libc.setns(ns, CLONE_NEWNS) != 0:
            raise OSError("setns(/proc/1/ns/mnt)")
    finally:
        os.close(ns)
    system = engineroot.system_parts([str(p) for p in orders["system"]])
    dev = {}
    for name in engineroot.DEV_NODES:
        with contextlib.suppress(OSError):
            dev[name] = engineroot.clone(f"/dev/{name}", recursive=False)
    storage = engineroot.clone(str(orders["storage"]))
    store = engineroot.clone(str(orders["store"]))
    if engineroot._libc.unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET) != 0:
        raise OSError("unshare")
    out_r, out_w = os.pipe()
    init = os.fork()
    if init == 0:
        code = 2
        try:
            # The daemon ends a copy that takes too long by killing this
            # launcher: the namespace's PID 1 (and with it every process of
            # the copy) goes too. (Its parent is outside its PID namespace,
            # so getppid says 0: a launcher killed before this line leaves
            # a copy that ends by its own step timeouts.)
            if engineroot._libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
                os._exit(2)
            os.close(out_r)
            build_root(system, dev, storage, store, str(orders["store"]), uid, gid)
            child = os.fork()
            if child == 0:
                try:
                    os.setgroups([int(g) for g in orders["groups"]])
                    os.setresgid(gid, gid, gid)
                    os.setresuid(uid, uid, uid)
                    os.chdir(WORK)
                    os.write(out_w, json.dumps(work(orders)).encode() + b"\n")
                    os._exit(0)
                except BaseException as exc:
                    with contextlib.suppress(OSError):
                        os.write(2, f"leviathd image store: {exc}\n".encode())
                    os._exit(2)
            os.close(out_w)
            _pid, status = os.waitpid(child, 0)
            code = os.waitstatus_to_exitcode(status) & 0xFF
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.write(2, f"leviathd image store: {exc}\n".encode())
        finally:
            os._exit(code)
    os.close(out_w)
    for fd in (storage, store, *dev.values(), *(x for x in system.values() if isinstance(x, int))):
        os.close(fd)
    with os.fdopen(out_r, "rb") as f:
        result = f.read(MAX_OUTPUT)
    _pid, status = os.waitpid(init, 0)
    sys.stdout.buffer.write(result)
    return os.waitstatus_to_exitcode(status) & 0xFF


if __name__ == "__main__":
    sys.exit(main())
