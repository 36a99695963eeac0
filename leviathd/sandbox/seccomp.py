"""A small seccomp filter for the agent: no new namespaces, no mounts, no
kernel keyring, no TIOCSTI.

Dropping capabilities already makes mount, setns and most of unshare fail.
What it does not stop is an unprivileged user namespace (allowed on most
distributions), inside which the agent would hold every capability again:
it could not reach the host's files from our root, but it could mount, and
the attack surface of a full set of capabilities in a user namespace is the
kernel's largest. The kernel keyring is not namespaced at all. So these calls
fail with EPERM (clone3 with ENOSYS, so that libc falls back to clone, whose
flags a classic BPF filter can read).

The filter is classic BPF, built here from a dozen instructions; no library
is needed for that.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import struct

from leviathd.errors import Unavailable

_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2

_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

_NEW_NAMESPACES = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
_TIOCSTI = 0x5412

# (audit arch, syscall numbers) per machine.
_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
            "clone": 56, "clone3": 435, "ioctl": 16, "keyctl": 250, "add_key": 248,
            "request_key": 249, "open_tree": 428, "move_mount": 429, "fsopen": 430,
            "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
            "clone": 220, "clone3": 435, "ioctl": 29, "keyctl": 219, "add_key": 217,
            "request_key": 218, "open_tree": 428, "move_mount": 429, "fsopen": 430,
            "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        },
    ),
}
_DENIED = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "keyctl", "add_key", "request_key",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
)


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter for `machine` (default: this one) as packed sock_filter
    instructions."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise Unavailable(f"no seccomp table for {machine}")
    arch, nr = _ARCHES[machine]
    eperm = _RET_ERRNO | errno.EPERM
    code = [
        _insn(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        _insn(_JEQ_K, 1, 0, arch),
        _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),  # another ABI: never
        _insn(_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        code += [_insn(_JGE_K, 0, 1, 0x40000000), _insn(_RET_K, 0, 0, eperm)]  # x32 calls
    for name in _DENIED:
        code += [_insn(_JEQ_K, 0, 1, nr[name]), _insn(_RET_K, 0, 0, eperm)]
    code += [
        _insn(_JEQ_K, 0, 1, nr["clone3"]),
        _insn(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
        # ioctl(fd, TIOCSTI, ...): typing into a terminal is refused.
        _insn(_JEQ_K, 0, 4, nr["ioctl"]),
        _insn(_LD_W_ABS, 0, 0, 24),  # args[1], low word
        _insn(_JEQ_K, 0, 1, _TIOCSTI),
        _insn(_RET_K, 0, 0, eperm),
        _insn(_RET_K, 0, 0, _RET_ALLOW),
        # clone(flags, ...) with a new-namespace flag is refused.
        _insn(_JEQ_K, 0, 3, nr["clone"]),
        _insn(_LD_W_ABS, 0, 0, 16),  # args[0], low word
        _insn(_JSET_K, 0, 1, _NEW_NAMESPACES),
        _insn(_RET_K, 0, 0, eperm),
        _insn(_RET_K, 0, 0, _RET_ALLOW),
    ]
    return b"".join(code)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def install() -> None:
    """Install the filter on this thread (needs no_new_privs or CAP_SYS_ADMIN);
    it is inherited by every child and kept across exec."""
    code = program()
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise Unavailable(f"cannot install the seccomp filter: {os.strerror(err)}")
