"""Bind sources handed to the engine by descriptor, not by path (issue 29,
break 7). The engine resolves a bind's source path when it starts the
container, long after the filter checked it: a folder on the way that the
agent replaces by a link meanwhile (its worktree's `d` swapped for a link to
its hidden `~/.ssh`) would be followed. So the daemon opens the checked path
as the agent's user (O_PATH, the last component not followed), checks that
the descriptor's own path is the one it checked, and bind-mounts that
descriptor onto a fresh entry of a root-only per-agent folder,
`/run/leviath/engine-binds/<agent>/<n>`, in the machine's mount namespace
(where the engine runs; the daemon's own is private to its unit). The engine
gets that path: nothing the agent can change, and the same object at every
start of the container. The mounts go when the agent ends (release).

The mounting is done by a short-lived helper process (`python -m
leviathd.enginesock.pins`): joining another mount namespace needs a process
whose file-system state no other thread shares.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import stat
import subprocess
import sys

from leviathd import fsat, fsids

PIN_ROOT = "/run/leviath/engine-binds"
MAX_PINS = 256
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MNT_DETACH = 2
_CLONE_NEWNS = 0x00020000
HELPER_TIMEOUT = 20


class PinError(Exception):
    pass


def open_checked(path: str, uid: int, gid: int) -> int:
    """An O_PATH descriptor of `path` opened with the user's file-system ids,
    the last component not followed; PinError unless the descriptor's own
    path is `path` (a folder on the way was swapped for a link)."""
    with fsids.as_user(uid, gid):
        try:
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise PinError(f"cannot open {path[:200]}: {exc.strerror}") from None
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            raise PinError(f"{path[:200]} became a link after the check")
        if os.readlink(f"/proc/self/fd/{fd}") != path:
            raise PinError(f"{path[:200]} changed after the check (a folder on the way "
                           "was replaced)")
    except BaseException:
        os.close(fd)
        raise
    return fd


class Pins:
    """One agent's pinned bind sources."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id
        self.count = 0

    def pin(self, path: str, uid: int, gid: int) -> str:
        """The engine's path for what the checked `path` names now (blocking:
        run it off the event loop)."""
        if self.count >= MAX_PINS:
            raise PinError(f"over {MAX_PINS} binds for one agent")
        # Unique across daemon restarts: an adopted agent's pins stay.
        name = secrets.token_hex(8)
        self.count += 1
        _helper({"op": "pin", "agent": self.agent_id, "name": name, "path": path,
                 "uid": uid, "gid": gid})
        return f"{PIN_ROOT}/{self.agent_id}/{name}"



def release(agent_id: str) -> None:
    """Unmount and remove an ended agent's pins (blocking). Not when its
    socket closes: a daemon restart adopts running agents, whose containers
    may start again from their pinned paths."""
    if os.path.isdir(f"{PIN_ROOT}/{agent_id}"):
        _helper({"op": "release", "agent": agent_id})


def _helper(req: dict[str, object]) -> None:
    try:
        done = subprocess.run([sys.executable, "-m", "leviathd.enginesock.pins"],
                              input=json.dumps(req), capture_output=True, text=True,
                              timeout=HELPER_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PinError(f"cannot pin the bind: {exc}") from None
    if done.returncode != 0:
        raise PinError((done.stderr.strip() or f"status {done.returncode}")[-500:])


# ------------------------------------------------------------- the helper


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_void_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


def _agent_dir(agent: str, *, create: bool) -> int | None:
    if not agent.isalnum() or len(agent) > 64:
        raise PinError("a bad agent id")
    top = fsat.open_dir(PIN_ROOT, create_mode=0o711 if create else None)
    try:
        if create:
            fsat.mkdir_at(top, agent, 0o711, exist_ok=True)
        elif fsat.lstat_at(top, agent) is None:
            return None
        return fsat.open_dir_at(top, agent)
    finally:
        os.close(top)


def _pin(libc: ctypes.CDLL, agent: str, name: str, fd: int) -> None:
    if not (len(name) == 16 and all(c in "0123456789abcdef" for c in name)):
        raise PinError("a bad pin name")
    folder = _agent_dir(agent, create=True)
    assert folder is not None
    try:
        if fsat.lstat_at(folder, name) is not None:
            raise PinError(f"pin {name} exists")
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            fsat.mkdir_at(folder, name, 0o700)
        else:
            os.close(fsat.open_at(folder, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        target = f"/proc/self/fd/{folder}/{name}".encode()
        source = f"/proc/self/fd/{fd}".encode()
        if libc.mount(source, target, None, _MS_BIND | _MS_REC, None) != 0:
            raise PinError(f"mount: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(folder)


def _release(libc: ctypes.CDLL, agent: str) -> None:
    folder = _agent_dir(agent, create=False)
    if folder is None:
        return
    try:
        for name in os.listdir(folder):
            if len(name) == 16:
                libc.umount2(f"/proc/self/fd/{folder}/{name}".encode(), _MNT_DETACH)
                # Only the empty mount point: never what a bind still shows.
                st = fsat.lstat_at(folder, name)
                with contextlib.suppress(OSError):
                    if st is not None and stat.S_ISDIR(st.st_mode):
                        fsat.rmdir_at(folder, name)
                    elif st is not None:
                        fsat.unlink_at(folder, name)
    finally:
        os.close(folder)
    top = fsat.open_dir(PIN_ROOT)
    try:
        with contextlib.suppress(OSError):
            fsat.rmdir_at(top, agent)
    finally:
        os.close(top)


def main() -> int:
    req = json.loads(sys.stdin.read(4096))
    libc = _libc()
    ns = os.open("/proc/1/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(ns, _CLONE_NEWNS) != 0:
            print(f"cannot join the machine's mounts: {os.strerror(ctypes.get_errno())}",
                  file=sys.stderr)
            return 1
    finally:
        os.close(ns)
    try:
        if req["op"] == "pin":
            # Opened here, in the machine's mount namespace: a bind's source
            # must be a mount of the namespace that mounts it.
            fd = open_checked(str(req["path"]), int(req["uid"]), int(req["gid"]))
            try:
                _pin(libc, str(req["agent"]), str(req["name"]), fd)
            finally:
                os.close(fd)
        elif req["op"] == "release":
            _release(libc, str(req["agent"]))
    except (PinError, OSError) as exc:
        print(str(exc)[:500], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
