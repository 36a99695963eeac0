"""Bind sources handed to the engine by descriptor, not by path (issue 29,
break 7). The engine resolves a bind's source path when it starts the
container, long after the filter checked it: a folder on the way that the
agent replaces by a link meanwhile (its worktree's `d` swapped for a link to
its hidden `~/.ssh`) would be followed. So the daemon opens the checked path
as the agent's user (O_PATH, the last component not followed), checks that
the descriptor's own path is the one it checked, and bind-mounts that
descriptor onto a fresh entry of a per-agent folder,
`/run/leviath/engine-binds/<agent>/<n>`, in the machine's mount namespace
(where the rootful engine runs; the daemon's own is private to its unit). The
engine gets that path: nothing the agent can change, and the same object at
every start of the container. The mounts go when the agent ends (release).

The agent's folder is root's, 0700 plus an ACL entry letting only the agent's
user through (search, not list): a rootless engine runs as that user and must
reach its pins, while the names are no secret from other users
(/proc/1/mountinfo lists them), so others must not pass. Without ACLs on /run
(a tmpfs built without them) the folder is root:<the user's group> 0710.

The agent's own rootless engine takes no pins (issue 43): it runs in the
agent's view (enginesock/engineroot.py) and gets the agent's own path, so a
link swapped in after the check leads nowhere the agent cannot go itself,
and the fence's read-only mounts inside the folder come along. `share_root`
(a shared mount point for the pins, for an engine that copies the machine's
mounts) is kept for such an engine, but none does now.

The mounting is done by a short-lived helper process (`python -m
leviathd.enginesock.pins`): joining another mount namespace needs a process
whose file-system state no other thread shares.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import secrets
import stat
import struct
import subprocess
import sys

from leviathd import fsat, fsids

PIN_ROOT = "/run/leviath/engine-binds"
MAX_PINS = 256
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 0x40000
_MS_SHARED = 0x100000
# system.posix_acl_access: version 2, then (tag u16, perm u16, id u32) sorted by tag
_ACL_VERSION = 2
_ACL_USER_OBJ, _ACL_USER, _ACL_GROUP_OBJ, _ACL_MASK, _ACL_OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_ACL_NO_ID = 0xFFFFFFFF
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



def share_root() -> None:
    """Make the pins' top folder a shared mount point of the machine's mount
    namespace (blocking; idempotent): call it before a rootless engine copies
    that namespace, so the pins mounted later reach the engine."""
    _helper({"op": "share"})


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


def _agent_dir(agent: str, *, create: bool, uid: int = -1, gid: int = -1) -> int | None:
    if not agent.isalnum() or len(agent) > 64:
        raise PinError("a bad agent id")
    top = fsat.open_dir(PIN_ROOT, create_mode=0o711 if create else None)
    try:
        if create:
            fsat.mkdir_at(top, agent, 0o700, exist_ok=True)
        elif fsat.lstat_at(top, agent) is None:
            return None
        fd = fsat.open_dir_at(top, agent)
    finally:
        os.close(top)
    if create:
        try:
            _only_user_passes(fd, uid, gid)
        except BaseException:
            os.close(fd)
            raise
    return fd


def _only_user_passes(fd: int, uid: int, gid: int) -> None:
    """Root's folder that only `uid` (and root) may pass through, none list."""
    if uid < 0 or gid < 0:
        raise PinError("a pin needs the agent's user")
    os.fchown(fd, 0, 0)
    os.fchmod(fd, 0o700)
    acl = struct.pack("<I", _ACL_VERSION) + b"".join(
        struct.pack("<HHI", tag, perm, ident) for tag, perm, ident in (
            (_ACL_USER_OBJ, 7, _ACL_NO_ID), (_ACL_USER, 1, uid), (_ACL_GROUP_OBJ, 0, _ACL_NO_ID),
            (_ACL_MASK, 1, _ACL_NO_ID), (_ACL_OTHER, 0, _ACL_NO_ID)))
    try:
        os.setxattr(fd, "system.posix_acl_access", acl)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP):
            raise
        # No ACLs here: the user's group passes (usually the user's own).
        os.fchown(fd, 0, gid)
        os.fchmod(fd, 0o710)


def _mounts() -> list[tuple[str, str]]:
    """(mount point, optional fields) of this process's mount namespace."""
    out: list[tuple[str, str]] = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            head = line.split(" - ", 1)[0].split()
            if len(head) >= 6:
                out.append((head[4], " ".join(head[6:])))
    return out


def _share(libc: ctypes.CDLL) -> None:
    os.close(fsat.open_dir(PIN_ROOT, create_mode=0o711))
    # PIN_ROOT's components are root's (/run, /run/leviath): by path is safe.
    target = PIN_ROOT.encode()
    found = [opt for point, opt in _mounts() if point == PIN_ROOT]
    if not found:
        # Recursive: pins already made (a daemon from before this) stay seen.
        if libc.mount(target, target, None, _MS_BIND | _MS_REC, None) != 0:
            raise PinError(f"mount --bind {PIN_ROOT}: {os.strerror(ctypes.get_errno())}")
        # Private first: a bind of a shared /run would join /run's peer group
        # and every pin would propagate back into /run's other copies too.
        if libc.mount(None, target, None, _MS_PRIVATE, None) != 0:
            raise PinError(f"mount --make-private {PIN_ROOT}: "
                           f"{os.strerror(ctypes.get_errno())}")
        found = [""]
    if not any("shared:" in opt for opt in found) and \
            libc.mount(None, target, None, _MS_SHARED, None) != 0:
        raise PinError(f"mount --make-shared {PIN_ROOT}: {os.strerror(ctypes.get_errno())}")


def _pin(libc: ctypes.CDLL, agent: str, name: str, fd: int, uid: int, gid: int) -> None:
    if not (len(name) == 16 and all(c in "0123456789abcdef" for c in name)):
        raise PinError("a bad pin name")
    folder = _agent_dir(agent, create=True, uid=uid, gid=gid)
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
                _pin(libc, str(req["agent"]), str(req["name"]), fd, int(req["uid"]),
                     int(req["gid"]))
            finally:
                os.close(fd)
        elif req["op"] == "share":
            _share(libc)
        elif req["op"] == "release":
            _release(libc, str(req["agent"]))
    except (PinError, OSError) as exc:
        print(str(exc)[:500], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
