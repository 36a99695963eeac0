"""The seccomp profile of every container agent: the engine's default profile
with the system calls of seccomp.REFUSED taken out of its allow lists and
refused, so that both kinds refuse the same calls from one table.

podman's default profile (containers-common) allows unshare, setns, mount,
keyctl and clone with any flags: inside a container with no capabilities
an agent could still make a user namespace and hold every capability there.

How the rules are written, for runc and crun (libseccomp underneath):
- a call with an unconditional rule ignores any conditional rule for it, so
  each refused name is first removed from every entry of the base profile;
- conditions on one argument in one entry are ORed, not ANDed; "ioctl
  allowed unless its request is TIOCSTI or TIOCLINUX" is therefore written as
  ALLOW entries that together cover every other 32-bit request, each a
  masked comparison of the low 32 bits (the kernel truncates the request to
  32 bits: a 64-bit != would let 0x1_00005412 through as TIOCSTI), plus
  ERRNO entries for the refused values;
- clone: allowed when no namespace flag is set, EPERM per flag otherwise
  (flags are the second argument on s390).

Without a readable base profile (docker, or podman without
containers-common) the profile allows by default and refuses only these
calls: weaker than the engine's default list, which then does not apply
either; `lev inspect` and docs/sandbox.md say which.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from typing import Any

from leviathd import fsat
from leviathd.sandbox.seccomp import Rule, refused

BASE_PROFILES = ("/etc/containers/seccomp.json", "/usr/share/containers/seccomp.json")
_MAX_BASE = 1 << 20
_S390 = ["s390", "s390x"]
_IO_URING = ("io_uring_setup", "io_uring_enter", "io_uring_register")
# Not a call on x86_64 or aarch64; libseccomp maps it where it exists.
_ALSO_REFUSED = ("umount",)


def read_base(paths: tuple[str, ...] = BASE_PROFILES) -> dict[str, Any] | None:
    """The engine's default profile, or None. Root-owned system files; a
    file that is not a JSON object is skipped."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != 0 or st.st_mode & 0o022 or st.st_size > _MAX_BASE:
                continue
            data = os.read(fd, _MAX_BASE)
        finally:
            os.close(fd)
        try:
            value = json.loads(data)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("syscalls"), list):
            return value
    return None


def _cover_except(values: tuple[int, ...], bits: int = 32) -> list[tuple[int, int]]:
    """(mask, value) pairs whose masked matches together are every `bits`-bit
    number except `values`: a binary trie walked from the top bit, one pair
    for each branch that leads to none of them."""
    out: list[tuple[int, int]] = []

    def walk(prefix_mask: int, prefix: int, group: set[int], bit: int) -> None:
        if bit < 0:
            return
        b = 1 << bit
        for side in (0, b):
            sub = {v for v in group if v & b == side}
            if not sub:
                out.append((prefix_mask | b, prefix | side))
            else:
                walk(prefix_mask | b, prefix | side, sub, bit - 1)

    walk(0, 0, {v & ((1 << bits) - 1) for v in values}, bits - 1)
    return out


def _masked(index: int, mask: int, value: int) -> dict[str, Any]:
    return {"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}


def _errno(names: list[str], number: int, **extra: Any) -> dict[str, Any]:
    return {"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": number, **extra}


def _arg_rules(rule: Rule) -> list[dict[str, Any]]:
    assert rule.arg is not None
    out: list[dict[str, Any]] = []
    arches: list[tuple[int, dict[str, Any]]] = [(rule.arg, {})]
    if rule.name == "clone":
        # s390 swaps clone's first two arguments.
        arches = [(0, {"excludes": {"arches": _S390}}), (1, {"includes": {"arches": _S390}})]
    for index, where in arches:
        if rule.mask:
            out.append({"names": [rule.name], "action": "SCMP_ACT_ALLOW",
                        "args": [_masked(index, rule.mask, 0)], **where})  # fmt: skip
            for bit in range(32):
                if rule.mask & (1 << bit):
                    args = [_masked(index, 1 << bit, 1 << bit)]
                    out.append(_errno([rule.name], rule.errno, args=args, **where))
        if rule.values:
            for mask, value in _cover_except(rule.values):
                out.append({"names": [rule.name], "action": "SCMP_ACT_ALLOW",
                            "args": [_masked(index, mask, value)], **where})  # fmt: skip
            for value in rule.values:
                out.append(_errno([rule.name], rule.errno,
                                  args=[_masked(index, 0xFFFFFFFF, value)], **where))  # fmt: skip
    return out


def profile(base: dict[str, Any] | None, *, allow_io_uring: bool = False) -> dict[str, Any]:
    """The profile: `base` (the engine's default, not modified) with REFUSED
    applied, or a default-allow profile with only REFUSED."""
    rules = refused(allow_io_uring=allow_io_uring)
    taken = {r.name for r in rules} | set(_ALSO_REFUSED)
    if allow_io_uring:
        taken |= set(_IO_URING)
    if base is None:
        out: dict[str, Any] = {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}
    else:
        out = copy.deepcopy(base)
    kept = []
    for entry in out.get("syscalls") or []:
        if not isinstance(entry, dict):
            continue
        names = [n for n in entry.get("names") or [] if n not in taken]
        if names:
            kept.append({**entry, "names": names})
    plain: dict[int, list[str]] = {}
    for rule in rules:
        if rule.arg is None:
            plain.setdefault(rule.errno, []).append(rule.name)
        else:
            kept += _arg_rules(rule)
    plain.setdefault(1, []).extend(_ALSO_REFUSED)
    for number, names in sorted(plain.items()):
        kept.append(_errno(names, number))
    if allow_io_uring:
        kept.append({"names": list(_IO_URING), "action": "SCMP_ACT_ALLOW"})
    out["syscalls"] = kept
    return out


def render(allow_io_uring: bool) -> tuple[str, str]:
    """(file name, text) of this machine's profile; the name carries a hash
    of the text, so a changed profile is a new file and a new warm-container
    key."""
    text = json.dumps(profile(read_base(), allow_io_uring=allow_io_uring), sort_keys=True)
    return f"seccomp-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json", text


def security_opt(folder: str, allow_io_uring: bool) -> list[str]:
    """The engine options that give a container the profile (see `write`)."""
    name, _text = render(allow_io_uring)
    return ["--security-opt", f"seccomp={os.path.join(folder, name)}"]


def write(folder: str, allow_io_uring: bool) -> None:
    """Put the profile into `folder` (root's own, made here if missing)
    unless it is there: the file the engine reads when it starts the
    container."""
    name, text = render(allow_io_uring)
    dir_fd = fsat.open_dir(folder, create_mode=0o755)
    try:
        if fsat.lstat_at(dir_fd, name) is None:
            fsat.atomic_write_at(dir_fd, name, text.encode(), mode=0o644)
    finally:
        os.close(dir_fd)
