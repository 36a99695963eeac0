"""cgroups: the engine is born inside the agent's scope, so systemd counts and
stops what it forks (conmon, the runtime) with the agent."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence

from leviathd.errors import Unavailable
from leviathd.systemd import absent
from leviathd.systemd.cgroupfs import folders
from leviathd.systemd.manager import SystemdError, SystemdManager

# The engine's limit options and the cgroup v2 controller each one writes.
_LIMIT_CONTROLLERS = {"--memory": "memory", "--memory-swap": "memory",
                      "--pids-limit": "pids", "--cpus": "cpu"}  # fmt: skip


def limits_the_parent_can_take(options: Sequence[str], subtree_control: str | None) -> list[str]:
    """`options` without the limit options whose controller the parent cgroup
    does not enable for its children (subtree_control: the text of its
    cgroup.subtree_control on a pure cgroup v2 host, None elsewhere).

    On pure cgroup v2 the agent's scope is not delegated and holds processes
    (the supervisor, conmon), so its children can never get the memory or pids
    controller (v2's no-internal-process rule): crun then fails to open
    memory.max and the container does not start (seen on Debian 13 once every
    agent got a default MemoryMax). Leaving those options out costs nothing:
    the scope's own MemoryMax, MemorySwapMax=0, TasksMax and CPUQuota, set
    from the same limits, hold over the container's cgroup below it."""
    if subtree_control is None:
        return list(options)
    enabled = set(subtree_control.split())
    out: list[str] = []
    skip = False
    for i, opt in enumerate(options):
        if skip:
            skip = False
            continue
        controller = _LIMIT_CONTROLLERS.get(opt)
        if controller is not None and controller not in enabled and i + 1 < len(options):
            skip = True
            continue
        out.append(opt)
    return out


def _subtree_control(cgroup: str) -> str | None:
    """The parent's cgroup.subtree_control on a pure cgroup v2 host, else None
    (v1 and hybrid hosts: the engine makes its cgroup in each v1 hierarchy,
    where every controller is there)."""
    if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return None
    try:
        with open(f"/sys/fs/cgroup{cgroup}/cgroup.subtree_control", encoding="ascii") as f:
            return f.read(4096)
    except (OSError, ValueError):
        return ""


def cgroup_procs_files(cgroup: str, mountinfo: str) -> list[str]:
    """The cgroup.procs file of `cgroup` (a path as systemd's ControlGroup
    gives it) in every mounted hierarchy where that cgroup may exist. Pure over
    the mount table; existence is checked by the caller."""
    return [posixpath.join(folder, "cgroup.procs") for folder in folders(cgroup, mountinfo)]


# A shell that writes its pid into each file before `--`, then execs the rest:
# everything the engine forks (conmon, runc) starts in the agent's scope.
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


async def _unit_cgroup(units: SystemdManager, unit: str) -> str:
    if not absent.booted():
        # No systemd: the daemon made the agent's cgroup itself, named so.
        return absent.control_group(unit)
    try:
        state = await units.unit_state(unit)
    except SystemdError as exc:
        raise Unavailable(f"no control group for {unit}: {exc}") from None
    cgroup = state.control_group if state is not None else ""
    if not cgroup.startswith("/"):
        raise Unavailable(f"no control group for {unit}: unit not found")
    return cgroup


def _join_files(cgroup: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        mountinfo = f.read()
    files = [p for p in cgroup_procs_files(cgroup, mountinfo) if os.path.exists(p)]
    if not files:
        raise Unavailable(f"the agent's control group {cgroup} is not mounted here")
    return files
