"""Issue 10 §2: one table of refused system calls makes both the namespace
kind's classic BPF filter and the container kind's OCI profile. The filter is
run here by a small BPF interpreter; the profile is read as runc would."""

from __future__ import annotations

import errno
import itertools
import json
from typing import Any

import bpf_interp
import pytest

from leviathd.config.load import parse_config
from leviathd.config.merge import resolve
from leviathd.sandbox import oci_seccomp, seccomp

# Written out from the issue, not taken from the code's table.
MUST_REFUSE = {
    "unshare", "setns", "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "keyctl", "add_key", "request_key", "bpf",
    "perf_event_open", "userfaultfd", "open_by_handle_at",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
}  # fmt: skip
IO_URING = {"io_uring_setup", "io_uring_enter", "io_uring_register"}
X86_64 = {"unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
          "clone": 56, "clone3": 435, "ioctl": 16, "keyctl": 250, "add_key": 248,
          "request_key": 249, "open_tree": 428, "move_mount": 429, "fsopen": 430,
          "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "bpf": 321,
          "perf_event_open": 298, "userfaultfd": 323, "open_by_handle_at": 304,
          "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
          "read": 0, "write": 1, "openat": 257}  # fmt: skip
ALLOW = 0x7FFF0000
EPERM = 0x00050000 | errno.EPERM
ENOSYS = 0x00050000 | errno.ENOSYS


def run_bpf(prog: bytes, nr: int, args: tuple[int, ...] = (), arch: int = 0xC000003E) -> int:
    return bpf_interp.run_bpf(prog, arch, nr, args)


@pytest.mark.parametrize("name", sorted(MUST_REFUSE))
def test_the_namespace_filter_refuses_each_call(name: str) -> None:
    assert run_bpf(seccomp.program("x86_64"), X86_64[name]) == EPERM


def test_the_namespace_filter_allows_ordinary_calls_and_io_uring_when_allowed() -> None:
    prog = seccomp.program("x86_64")
    for name in ("read", "write", "openat"):
        assert run_bpf(prog, X86_64[name]) == ALLOW
    assert run_bpf(prog, X86_64["clone3"]) == ENOSYS
    assert run_bpf(prog, X86_64["clone"], (0x11 | 0x3D0F00,)) == ALLOW  # fork/thread flags
    assert run_bpf(prog, X86_64["clone"], (0x10000000 | 17,)) == EPERM
    assert run_bpf(prog, X86_64["ioctl"], (0, 0x5412)) == EPERM
    assert run_bpf(prog, X86_64["ioctl"], (0, 0x1_0000_541C)) == EPERM
    assert run_bpf(prog, X86_64["ioctl"], (0, 0x541B)) == ALLOW
    allowed = seccomp.program("x86_64", allow_io_uring=True)
    for name in IO_URING:
        assert run_bpf(allowed, X86_64[name]) == ALLOW
    assert run_bpf(allowed, X86_64["keyctl"]) == EPERM


def _base() -> dict[str, Any]:
    # The shape of podman's default: a big unconditional allow list.
    return {
        "defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
        "syscalls": [
            {"names": ["read", "clone", "clone3", "ioctl", "unshare", "mount", "keyctl"],
             "action": "SCMP_ACT_ALLOW"},
            {"names": ["bpf", "setns"], "action": "SCMP_ACT_ALLOW",
             "includes": {"caps": ["CAP_SYS_ADMIN"]}},
        ],
    }  # fmt: skip


def _matches(entry: dict[str, Any], name: str, args: tuple[int, ...]) -> bool:
    """One entry, as runc and libseccomp read it (conditions ORed on one
    argument, masked comparisons on the low bits the mask names)."""
    if name not in entry["names"] or "s390" in entry.get("includes", {}).get("arches", []):
        return False
    conds = entry.get("args") or []
    full = list(args) + [0] * 6
    return not conds or any(full[c["index"]] & c["value"] == c["valueTwo"] for c in conds)


def _action(profile: dict[str, Any], name: str, args: tuple[int, ...] = ()) -> tuple[str, int]:
    hits = {(e["action"], e.get("errnoRet", 0)) for e in profile["syscalls"]
            if _matches(e, name, args) and "caps" not in e.get("includes", {})}  # fmt: skip
    assert len(hits) <= 1, (name, args, hits)  # never two actions for one call
    return hits.pop() if hits else (profile["defaultAction"], profile.get("defaultErrnoRet", 0))


def test_the_profile_refuses_each_call_and_drops_it_from_the_base_allow_lists() -> None:
    profile = oci_seccomp.profile(_base())
    for name in MUST_REFUSE | {"umount"}:
        assert _action(profile, name) == ("SCMP_ACT_ERRNO", errno.EPERM), name
        unconditional = [e for e in profile["syscalls"]
                         if name in e["names"] and e["action"] == "SCMP_ACT_ALLOW"]
        assert not unconditional, (name, unconditional)
    assert _action(profile, "read") == ("SCMP_ACT_ALLOW", 0)
    assert _action(profile, "clone3") == ("SCMP_ACT_ERRNO", errno.ENOSYS)
    assert _base()["syscalls"][0]["names"][3] == "ioctl"  # the caller's base untouched


@pytest.mark.parametrize("flag", [0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000,
                                  0x20000000, 0x40000000])  # fmt: skip
def test_the_profile_refuses_clone_with_each_namespace_flag(flag: int) -> None:
    profile = oci_seccomp.profile(_base())
    assert _action(profile, "clone", (flag | 17,)) == ("SCMP_ACT_ERRNO", errno.EPERM)
    assert _action(profile, "clone", (flag | 0x10000000 | 0x3D0F00,)) == (
        "SCMP_ACT_ERRNO", errno.EPERM)
    assert _action(profile, "clone", (0x3D0F00 | 17,)) == ("SCMP_ACT_ALLOW", 0)


@pytest.mark.parametrize("request_", [0x5412, 0x541C, 0x1_0000_5412, 0xFFFF_FFFF_0000_541C])
def test_the_profile_refuses_tiocsti_and_tioclinux_whatever_the_high_bits(request_: int) -> None:
    assert _action(oci_seccomp.profile(_base()), "ioctl", (1, request_)) == (
        "SCMP_ACT_ERRNO", errno.EPERM)


def test_the_profile_allows_every_other_ioctl() -> None:
    profile = oci_seccomp.profile(_base())
    for request_ in (0, 1, 0x5401, 0x5411, 0x5413, 0x541B, 0x541D, 0x5412 ^ 0x80000000,
                     0x541C ^ 1, 0xFFFFFFFF, 0x8004_5412):  # fmt: skip
        assert _action(profile, "ioctl", (1, request_)) == ("SCMP_ACT_ALLOW", 0), hex(request_)


def test_cover_except_is_exactly_the_complement_on_small_widths() -> None:
    for width in (3, 5):
        for values in itertools.combinations(range(1 << width), 2):
            pairs = oci_seccomp._cover_except(values, bits=width)
            for x in range(1 << width):
                hit = sum(1 for m, v in pairs if x & m == v)
                assert hit == (0 if x in values else 1), (width, values, x)


def test_io_uring_is_allowed_only_when_asked_and_without_a_base_the_profile_allows_by_default(
) -> None:
    allowed = oci_seccomp.profile(_base(), allow_io_uring=True)
    for name in IO_URING:
        assert _action(allowed, name) == ("SCMP_ACT_ALLOW", 0)
    bare = oci_seccomp.profile(None)
    assert bare["defaultAction"] == "SCMP_ACT_ALLOW"
    for name in MUST_REFUSE:
        assert _action(bare, name) == ("SCMP_ACT_ERRNO", errno.EPERM)
    json.dumps(bare)


def test_only_the_machine_config_can_allow_io_uring() -> None:
    machine_on = parse_config("[sandbox]\nallow_io_uring = true\n", "machine")
    machine_off = parse_config("[sandbox]\n", "machine")
    user_on = parse_config("[sandbox]\nallow_io_uring = true\n", "user")
    user_off = parse_config("[sandbox]\nallow_io_uring = false\n", "user")
    assert resolve(machine_on, None, None, "a").agent.allow_io_uring
    got = resolve(machine_off, user_on, None, "a")
    assert not got.agent.allow_io_uring
    assert any(f.code == "io-uring-ignored" for f in got.findings)
    assert not resolve(machine_on, user_off, None, "a").agent.allow_io_uring
