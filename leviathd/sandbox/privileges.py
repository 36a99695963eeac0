"""Drop from root to the agent's user with no way back.

Order matters and follows the kernel's rules:

1. groups, then gid, while we still have CAP_SETGID;
2. the bounding set, while we still have CAP_SETPCAP (it limits what any later
   exec, setuid binaries included, can gain);
3. ambient and inheritable emptied, keep-caps off, so nothing survives setuid
   or exec;
4. `no_new_privs` (setuid bits and file capabilities are ignored on exec);
5. setresuid: the kernel empties permitted and effective when every uid leaves 0;
6. an explicit capset of all zeros (covers a uid 0 target) and a read-back that
   proves every set is empty;
7. a fresh session keyring of the user's own: the daemon's session keyring
   would otherwise be shared by every process it starts, so one user's agent
   could read, or plant, keys another user's agent or credential command uses.

python-prctl covers the prctl options; capget/capset go through libc, since
python-prctl's set list is fixed at its build time and may miss newer caps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import secrets
from collections.abc import Callable, Sequence

import prctl

from leviathd.errors import Unavailable

_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SYS_CAPGET = 125
_SYS_CAPSET = 126
# Looked up once here: the keyring is joined in forked children (preexec_fn),
# where the less done the better.
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219}.get(platform.machine())
# For a process that joins a keyring itself (broker/opener_worker.py).
KEYCTL_SYSCALL = _SYS_KEYCTL
_KEYCTL_JOIN_SESSION_KEYRING = 1


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _read_last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read().strip())
    except OSError:
        return 63


# Read once, in the daemon: the drop runs in forked children, twice per
# agent (issue 18), and the kernel's number does not change while it runs.
_LAST_CAP = _read_last_cap()


def _last_cap() -> int:
    return _LAST_CAP


def _capget() -> tuple[int, int, int]:
    """(effective, permitted, inheritable) of this thread as 64-bit masks."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.syscall(_SYS_CAPGET, ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capget: {os.strerror(err)}")
    return (
        data[0].effective | data[1].effective << 32,
        data[0].permitted | data[1].permitted << 32,
        data[0].inheritable | data[1].inheritable << 32,
    )


def _capset(effective: int, permitted: int, inheritable: int) -> None:
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    for i in range(2):
        shift = 32 * i
        data[i].effective = (effective >> shift) & 0xFFFFFFFF
        data[i].permitted = (permitted >> shift) & 0xFFFFFFFF
        data[i].inheritable = (inheritable >> shift) & 0xFFFFFFFF
    if _libc.syscall(_SYS_CAPSET, ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")


def _ambient_clear() -> None:
    if _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        # EINVAL: a kernel without ambient capabilities (< 4.3) has none to clear.
        if err != 22:
            raise OSError(err, f"PR_CAP_AMBIENT_CLEAR_ALL: {os.strerror(err)}")


def drop_bounding_set() -> None:
    """Empty the bounding set (needs CAP_SETPCAP)."""
    for cap in range(_last_cap() + 1):
        try:
            prctl.capbset_drop(cap)
        except (OSError, ValueError):
            # python-prctl may not know caps newer than its build; use libc.
            if _libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                err = ctypes.get_errno()
                if err != 22:  # EINVAL: no such capability on this kernel
                    raise OSError(err, f"PR_CAPBSET_DROP {cap}: {os.strerror(err)}") from None


def capability_sets() -> dict[str, int]:
    """Every capability set of this process, for checks and tests."""
    eff, perm, inh = _capget()
    bounding = 0
    for cap in range(_last_cap() + 1):
        if _libc.prctl(23, cap, 0, 0, 0) == 1:  # PR_CAPBSET_READ
            bounding |= 1 << cap
    ambient = 0
    for cap in range(_last_cap() + 1):
        if _libc.prctl(_PR_CAP_AMBIENT, 1, cap, 0, 0) == 1:  # PR_CAP_AMBIENT_IS_SET
            ambient |= 1 << cap
    return {
        "effective": eff,
        "permitted": perm,
        "inheritable": inh,
        "bounding": bounding,
        "ambient": ambient,
    }


def join_new_session_keyring() -> int:
    """`keyctl new_session`: join a keyring made now, under a name nobody has
    used, so nothing of the parent's keyring stays reachable through @s.
    Returns its serial (0 where the kernel has no keys at all, which leaves
    nothing to share either)."""
    nr = _SYS_KEYCTL
    if nr is None:
        raise OSError(errno.ENOSYS, f"keyctl: no syscall number known for {platform.machine()}")
    name = f"leviath-{secrets.token_hex(8)}".encode()
    serial = _libc.syscall(nr, _KEYCTL_JOIN_SESSION_KEYRING, ctypes.c_char_p(name), 0, 0, 0)
    if serial < 0:
        err = ctypes.get_errno()
        if err == errno.ENOSYS:
            return 0
        if err == errno.EDQUOT:
            # Seen at ~200 agents of one user (bench/scale.py): the message
            # names the knob (docs/operations.md, "How many agents").
            raise OSError(err, "KEYCTL_JOIN_SESSION_KEYRING: the user's kernel key quota is "
                          "full (sysctl kernel.keys.maxkeys and kernel.keys.maxbytes: each "
                          "running agent holds one or two keyrings)")
        raise OSError(err, f"KEYCTL_JOIN_SESSION_KEYRING: {os.strerror(err)}")
    return int(serial)


def user_command(
    uid: int, gid: int, groups: Sequence[int], *, real_gid: int | None = None
) -> Callable[[], None]:
    """A `preexec_fn` for a command run for a user outside any fence (the
    credential tool's commands): the same drop as every other process started
    for a user, no_new_privs included, with a keyring of its own. It does the
    switch itself, so pass no user/group/extra_groups to subprocess (which
    would switch first and leave no CAP_SETPCAP to empty the bounding set).
    `real_gid`: see broker/credentials.py `_guarded` (keeps the user out of /proc)."""

    def preexec() -> None:
        drop_to_user(uid, gid, groups, no_new_privs=True, real_gid=real_gid)

    return preexec


def root_command() -> None:
    """A `preexec_fn` for a command the machine config runs as root (a
    credential's secret_command): still not in the daemon's keyring."""
    join_new_session_keyring()


def drop_to_user(
    uid: int, gid: int, groups: Sequence[int], *, no_new_privs: bool,
    real_gid: int | None = None,
) -> None:
    """Become uid/gid/groups with every capability set empty.

    Must be called as root (or with CAP_SETUID, CAP_SETGID and CAP_SETPCAP).
    Raises Unavailable when any step fails or a set is not empty afterwards:
    the caller must not exec in that case.
    """
    try:
        os.setgroups(list(groups))
        os.setresgid(gid if real_gid is None else real_gid, gid, gid)
        drop_bounding_set()
        _ambient_clear()
        prctl.set_keepcaps(False)
        eff, perm, _ = _capget()
        _capset(eff, perm, 0)
        if no_new_privs:
            prctl.set_no_new_privs(1)
        os.setresuid(uid, uid, uid)
        _capset(0, 0, 0)
        # After the uid change, so the keyring is the user's (and counts
        # against the user's key quota, not root's).
        join_new_session_keyring()
    except OSError as exc:
        raise Unavailable(f"cannot drop privileges to uid {uid}: {exc}") from exc
    left = {name: mask for name, mask in capability_sets().items() if mask}
    if left:
        raise Unavailable(f"capabilities remain after dropping to uid {uid}: {left}")
    want_gids = (gid if real_gid is None else real_gid, gid, gid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != want_gids:
        raise Unavailable(f"uid/gid did not change to {uid}/{gid}")
    if no_new_privs and prctl.get_no_new_privs() != 1:
        raise Unavailable("no_new_privs did not stick")
