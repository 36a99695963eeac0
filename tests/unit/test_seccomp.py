"""leviathd/sandbox/seccomp.py on its own: the system call numbers of each
architecture it knows, held against the kernel's own headers; the filter it
builds for each architecture, run by a BPF interpreter; and the filter
installed in a real process, refusing what it says and nothing else."""

from __future__ import annotations

import errno
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bpf_interp import run_bpf

from leviathd.errors import Unavailable
from leviathd.sandbox import seccomp

HEADERS = {
    "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    # arm64 takes the generic table.
    "aarch64": Path("/usr/include/asm-generic/unistd.h"),
}
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
ALLOW = 0x7FFF0000
KILL = 0x80000000


def _errno_ret(code: int) -> int:
    return 0x00050000 | code


def _header_numbers(path: Path) -> dict[str, int]:
    text = path.read_text()
    return {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)\b", text)}


@pytest.mark.parametrize("machine", sorted(HEADERS))
def test_the_syscall_numbers_are_the_kernels(machine: str) -> None:
    header = HEADERS[machine]
    if not header.exists():
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    kernel = _header_numbers(header)
    arch, numbers = seccomp._ARCHES[machine]
    assert arch == AUDIT_ARCH[machine]
    for name, nr in numbers.items():
        assert kernel.get(name) == nr, f"{machine} {name}: {nr}, the kernel says {kernel.get(name)}"


@pytest.mark.parametrize("machine", sorted(AUDIT_ARCH))
def test_every_refused_call_has_a_number_and_is_refused_on_each_machine(machine: str) -> None:
    arch, numbers = seccomp._ARCHES[machine]
    prog = seccomp.program(machine)
    for rule in seccomp.REFUSED:
        assert rule.name in numbers, f"{machine} has no number for {rule.name}"
        args = [0] * 6
        if rule.arg is not None:
            args[rule.arg] = rule.values[0] if rule.values else rule.mask
        assert run_bpf(prog, arch, numbers[rule.name], tuple(args)) == _errno_ret(rule.errno), (
            machine, rule.name)
    # Its own calls that no rule names pass.
    others = set(range(0, 460)) - set(numbers.values())
    for nr in sorted(others)[:200]:
        assert run_bpf(prog, arch, nr) == ALLOW, (machine, nr)


@pytest.mark.parametrize("machine", sorted(AUDIT_ARCH))
def test_argument_rules_refuse_only_their_values(machine: str) -> None:
    arch, nr = seccomp._ARCHES[machine]
    prog = seccomp.program(machine)
    assert run_bpf(prog, arch, nr["ioctl"], (1, seccomp.TIOCSTI)) == _errno_ret(errno.EPERM)
    assert run_bpf(prog, arch, nr["ioctl"], (1, 0x5401)) == ALLOW  # TCGETS
    # clone's flags: a thread is fine, any new namespace is not.
    assert run_bpf(prog, arch, nr["clone"], (0x3D0F00,)) == ALLOW
    for flag in (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                 0x40000000):
        assert run_bpf(prog, arch, nr["clone"], (flag,)) == _errno_ret(errno.EPERM), hex(flag)
    assert run_bpf(prog, arch, nr["clone3"]) == _errno_ret(errno.ENOSYS)


def test_another_abi_is_killed_and_x32_refused() -> None:
    prog = seccomp.program("x86_64")
    # A 32-bit call (int 0x80) is another audit arch: the process dies.
    assert run_bpf(prog, 0x40000003, 0) == KILL
    assert run_bpf(seccomp.program("aarch64"), AUDIT_ARCH["x86_64"], 0) == KILL
    # x32 numbers carry bit 30 under the x86_64 arch.
    assert run_bpf(prog, AUDIT_ARCH["x86_64"], 0x40000000 | 272) == _errno_ret(errno.EPERM)


def test_io_uring_only_when_allowed() -> None:
    arch, nr = seccomp._ARCHES["x86_64"]
    names = ("io_uring_setup", "io_uring_enter", "io_uring_register")
    for allow, want in ((False, _errno_ret(errno.EPERM)), (True, ALLOW)):
        prog = seccomp.program("x86_64", allow_io_uring=allow)
        assert {run_bpf(prog, arch, nr[n]) for n in names} == {want}


def test_an_unknown_machine_is_refused() -> None:
    with pytest.raises(Unavailable):
        seccomp.program("mips")


_INSTALLED = r"""
import ctypes, errno, os, socket
from leviathd.sandbox import seccomp

libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
seccomp.install()
net = os.open("/proc/self/ns/net", os.O_RDONLY)
out = []
for what, call in (
    ("unshare", lambda: libc.unshare(0x10000000)),  # CLONE_NEWUSER
    ("setns", lambda: libc.setns(net, 0)),
    ("keyctl", lambda: libc.syscall(250, 0, 0, 0, 0)),  # KEYCTL_GET_KEYRING_ID
    ("mount", lambda: libc.mount(b"none", b"/mnt", b"tmpfs", 0, None)),
):
    ctypes.set_errno(0)
    rc = call()
    out.append(f"{what}:{'ok' if rc != -1 else errno.errorcode[ctypes.get_errno()]}")
out.append(f"getpid:{'ok' if os.getpid() > 0 else 'no'}")
socket.socketpair()[0].close()
out.append("socketpair:ok")
print(" ".join(out))
"""


@pytest.mark.skipif(seccomp.platform.machine() != "x86_64", reason="keyctl number is x86_64's")
def test_the_installed_filter_refuses_what_it_says() -> None:
    got = subprocess.run([sys.executable, "-c", _INSTALLED], capture_output=True, text=True,
                         timeout=30, check=False)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["unshare:EPERM", "setns:EPERM", "keyctl:EPERM",
                                  "mount:EPERM", "getpid:ok", "socketpair:ok"]
