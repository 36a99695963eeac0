"""The system calls no agent may make, in one table (REFUSED), and the
namespace kind's filter built from it. leviathd/sandbox/oci_seccomp.py turns
the same table into the seccomp profile every container agent gets.

Dropping capabilities already makes mount, setns and most of unshare fail.
What it does not stop is an unprivileged user namespace (allowed on most
distributions), inside which the agent would hold every capability again:
it could not reach the host's files from our root, but it could mount, and
the attack surface of a full set of capabilities in a user namespace is the
kernel's largest. The kernel keyring is not namespaced at all. bpf,
perf_event_open, userfaultfd and io_uring are large attack surfaces that
build tools and agents do not need; open_by_handle_at opens files by inode
handle, past any mount table. TIOCSTI and TIOCLINUX type into (or paste
from) a terminal. So these calls fail with EPERM (clone3 with ENOSYS, so
that libc falls back to clone, whose flags a classic BPF filter can read).

io_uring can be allowed by the machine config (`[sandbox] allow_io_uring`).

The filter is classic BPF, built here from a few dozen instructions; no
library is needed for that.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import struct
from dataclasses import dataclass

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

NEW_NAMESPACES = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
TIOCSTI = 0x5412
TIOCLINUX = 0x541C


@dataclass(frozen=True)
class Rule:
    """One refused system call. Without `arg` it is refused whatever its
    arguments; with `arg`, only when the low 32 bits of that argument equal
    one of `values` or share a bit with `mask` (the kernel reads ioctl's
    request as 32 bits: comparing all 64 would let high bits slip past)."""

    name: str
    errno: int = errno.EPERM
    arg: int | None = None
    values: tuple[int, ...] = ()
    mask: int = 0
    io_uring: bool = False


REFUSED: tuple[Rule, ...] = (
    # New namespaces, and joining others'.
    Rule("unshare"),
    Rule("setns"),
    Rule("clone", arg=0, mask=NEW_NAMESPACES),
    Rule("clone3", errno=errno.ENOSYS),
    # The mount family, old and new API.
    Rule("mount"), Rule("umount2"), Rule("pivot_root"),
    Rule("open_tree"), Rule("move_mount"), Rule("fsopen"), Rule("fsconfig"),
    Rule("fsmount"), Rule("fspick"), Rule("mount_setattr"),
    # The kernel keyring: not namespaced, shared with the user's sessions.
    Rule("keyctl"), Rule("add_key"), Rule("request_key"),
    # Large kernel attack surfaces, or a way past the mount table.
    Rule("bpf"), Rule("perf_event_open"), Rule("userfaultfd"), Rule("open_by_handle_at"),
    # Typing into, or reading the selection of, a terminal.
    Rule("ioctl", arg=1, values=(TIOCSTI, TIOCLINUX)),
    Rule("io_uring_setup", io_uring=True),
    Rule("io_uring_enter", io_uring=True),
    Rule("io_uring_register", io_uring=True),
)  # fmt: skip


def refused(*, allow_io_uring: bool = False) -> tuple[Rule, ...]:
    return tuple(r for r in REFUSED if not (r.io_uring and allow_io_uring))


# (audit arch, syscall numbers) per machine.
_ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
            "clone": 56, "clone3": 435, "ioctl": 16, "keyctl": 250, "add_key": 248,
            "request_key": 249, "open_tree": 428, "move_mount": 429, "fsopen": 430,
            "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
            "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "open_by_handle_at": 304,
            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        },
    ),
    "aarch64": (
        0xC00000B7,
        {
            "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
            "clone": 220, "clone3": 435, "ioctl": 29, "keyctl": 219, "add_key": 217,
            "request_key": 218, "open_tree": 428, "move_mount": 429, "fsopen": 430,
            "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
            "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "open_by_handle_at": 265,
            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        },
    ),
}  # fmt: skip


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def _arg_block(rule: Rule, ret: int) -> list[bytes]:
    """Instructions run once the call is `rule.name`: refuse on a match,
    else allow (each call has one rule)."""
    assert rule.arg is not None
    code = [_insn(_LD_W_ABS, 0, 0, 16 + 8 * rule.arg)]  # args[i], low word (little endian)
    for value in rule.values:
        code += [_insn(_JEQ_K, 0, 1, value), _insn(_RET_K, 0, 0, ret)]
    if rule.mask:
        code += [_insn(_JSET_K, 0, 1, rule.mask), _insn(_RET_K, 0, 0, ret)]
    return [*code, _insn(_RET_K, 0, 0, _RET_ALLOW)]


def program(machine: str | None = None, *, allow_io_uring: bool = False) -> bytes:
    """The filter for `machine` (default: this one) as packed sock_filter
    instructions."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise Unavailable(f"no seccomp table for {machine}")
    arch, nr = _ARCHES[machine]
    code = [
        _insn(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        _insn(_JEQ_K, 1, 0, arch),
        _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),  # another ABI: never
        _insn(_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        code += [_insn(_JGE_K, 0, 1, 0x40000000),
                 _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)]  # x32 calls  # fmt: skip
    rules = refused(allow_io_uring=allow_io_uring)
    assert len({r.name for r in rules}) == len(rules), "one rule per system call"
    for rule in rules:
        ret = _RET_ERRNO | rule.errno
        if rule.arg is None:
            code += [_insn(_JEQ_K, 0, 1, nr[rule.name]), _insn(_RET_K, 0, 0, ret)]
        else:
            block = _arg_block(rule, ret)
            code += [_insn(_JEQ_K, 0, len(block), nr[rule.name]), *block]
    code.append(_insn(_RET_K, 0, 0, _RET_ALLOW))
    return b"".join(code)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


# The packed program per io_uring choice, built once in the daemon: every
# fence's PID 1 is a fork of it and finds its filter ready, with no Python
# work of building it between the fork and the command's exec (issue 18).
_BUILT: dict[bool, tuple[ctypes.Array[ctypes.c_char], _SockFprog]] = {}


def prepare(*, allow_io_uring: bool = False) -> None:
    """Build the filter now (in the daemon, before it forks agents), for
    install() to find. Bytes, never changed once built: a fork sees the
    parent's copy, so nothing the agent can reach decides what it holds."""
    if allow_io_uring in _BUILT:
        return
    code = program(allow_io_uring=allow_io_uring)
    buf = ctypes.create_string_buffer(code, len(code))
    _BUILT[allow_io_uring] = (buf, _SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p)))


def install(*, allow_io_uring: bool = False) -> None:
    """Install the filter on this thread (needs no_new_privs or CAP_SYS_ADMIN);
    it is inherited by every child and kept across exec."""
    prepare(allow_io_uring=allow_io_uring)
    _buf, prog = _BUILT[allow_io_uring]
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise Unavailable(f"cannot install the seccomp filter: {os.strerror(err)}")
