"""The limits an agent gets when no config sets them, from the machine's size.

Without them an agent's scope had no MemoryMax at all: one agent could take
the machine's memory, and its /dev/shm was a tmpfs of half the RAM. The rule
(docs/configuration.md, "Limits by default"):

- memory_max: a quarter of the RAM (MemTotal), at least 256 MiB, rounded down
  to a MiB; swap is always off for an agent (MemorySwapMax=0);
- tasks_max: a twentieth of the smaller of kernel.pid_max and
  kernel.threads-max, between 512 and 4096;
- cpu_weight: 50, half of any other unit's default, so that agents yield the
  CPU to logins and services when the machine is busy (weights are relative,
  so the number does not depend on the machine's size).

leviath.slice (units/) caps all agents together. A value a config sets
replaces the default; "infinity" is the same as not setting it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MIB = 1 << 20
MEMORY_FLOOR = 256 * MIB
TASKS_FLOOR = 512
TASKS_CEILING = 4096
CPU_WEIGHT = 50
# /dev/shm and the sandbox's other tmpfs mounts: half the agent's memory, as
# the kernel's default is half the machine's (their pages count against the
# agent's MemoryMax either way; the size keeps `df` honest and one mount from
# taking it all).
TMPFS_SHARE = 2


@dataclass(frozen=True)
class MachineSize:
    memory: int  # bytes
    tasks: int  # min(kernel.pid_max, kernel.threads-max)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read(64).strip())
    except (OSError, ValueError):
        return None


def _mem_total(path: str = "/proc/meminfo") -> int | None:
    try:
        with open(path) as f:
            for line in f.read(8192).splitlines():
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine_size() -> MachineSize:
    """This machine's, as the kernel reports it now (a guess of 1 GiB and
    32768 tasks where it cannot be read: the defaults stay finite)."""
    tasks = [n for n in (_read_int("/proc/sys/kernel/pid_max"),
                         _read_int("/proc/sys/kernel/threads-max")) if n]  # fmt: skip
    return MachineSize(memory=_mem_total() or 1 << 30, tasks=min(tasks) if tasks else 32768)


def defaults(size: MachineSize) -> dict[str, int]:
    memory = max(MEMORY_FLOOR, size.memory // 4) // MIB * MIB
    tasks = min(TASKS_CEILING, max(TASKS_FLOOR, size.tasks // 20))
    return {"memory_max": memory, "tasks_max": tasks, "cpu_weight": CPU_WEIGHT}


def fill(
    limits: Mapping[str, int | None], size: MachineSize | None = None
) -> dict[str, int | None]:
    """`limits` (memory_max, tasks_max, cpu_quota, cpu_weight; None = not
    set) with the machine's default wherever one is missing."""
    base = defaults(size or machine_size())
    out = dict(limits)
    for key, value in base.items():
        if out.get(key) is None:
            out[key] = value
    return out


def tmpfs_size(limits: Mapping[str, int | None]) -> int | None:
    """The size of the agent's /dev/shm and tmpfs mounts, in bytes."""
    memory = limits.get("memory_max")
    if memory is None:
        return None
    return max(MIB, memory // TMPFS_SHARE // 4096 * 4096)
