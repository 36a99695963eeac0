"""Limits by default (issue 10 §3): with no [resources] in any config, every
agent's scope still has a finite MemoryMax, MemorySwapMax=0, TasksMax and
CPUWeight, its /dev/shm is sized from its memory limit, and a memory hog dies
in its own scope while the daemon and another agent live on.

The expected numbers are computed here from the documented rule
(docs/configuration.md), not taken from the code. For the hog, the bed is
shown a 1 GiB machine: a file bound over /proc/meminfo inside the bed (the
daemon reads the machine's size there, as LXCFS would show it in a
container), so the default limit is 256 MiB rather than a quarter of the
host's RAM."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

pytestmark = pytest.mark.testbed

FAKE_MEMINFO = "/run/leviath-test-meminfo"
GIB = 1 << 30


def lev(bed: Testbed, *args: str, check: bool = True, timeout: float = 60):
    return bed.run(["lev", *args], user="alice", cwd=f"{bed.users['alice'].home}/work",
                   check=check, timeout=timeout)  # fmt: skip


def expected(bed: Testbed) -> tuple[int, int]:
    """(memory_max, tasks_max) by the documented rule, from the bed's view."""
    mem = int(re.search(r"MemTotal:\s+(\d+) kB", bed.read_file("/proc/meminfo")).group(1)) * 1024
    pid_max = int(bed.read_file("/proc/sys/kernel/pid_max"))
    threads = int(bed.read_file("/proc/sys/kernel/threads-max"))
    memory = max(256 << 20, mem // 4) // (1 << 20) * (1 << 20)
    return memory, min(4096, max(512, min(pid_max, threads) // 20))


def prop(bed: Testbed, unit: str, name: str) -> str:
    return bed.run(["systemctl", "show", "-P", name, unit]).stdout.strip()


def row(bed: Testbed, agent_id: str) -> dict:
    return next(r for r in json.loads(lev(bed, "ps", "--json", "--all").stdout)
                if r["id"] == agent_id)  # fmt: skip


def start(bed: Testbed, *command: str) -> str:
    out = lev(bed, "run", "--detach", "--", *command).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", out), out
    return out


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.run(["mkdir", "-p", "work"], user="alice")
    testbed.run(["rm", "-f", f"{testbed.users['alice'].home}/.config/leviath/config.toml"])
    with testbed.machine_config("# no [resources] anywhere\n"):
        yield testbed


def test_with_no_config_an_agent_scope_has_finite_limits_in_systemd_and_the_kernel(
    bed: Testbed,
) -> None:
    memory, tasks = expected(bed)
    agent_id = start(bed, "sleep", "300")
    try:
        unit = row(bed, agent_id)["unit"]
        assert prop(bed, unit, "MemoryMax") == str(memory)
        assert prop(bed, unit, "MemorySwapMax") == "0"
        assert prop(bed, unit, "TasksMax") == str(tasks)
        assert prop(bed, unit, "CPUWeight") == "50"
        cg = prop(bed, unit, "ControlGroup")
        files = bed.run(
            f"cat /sys/fs/cgroup/memory{cg}/memory.limit_in_bytes "
            f"/sys/fs/cgroup/pids{cg}/pids.max 2>/dev/null || "
            f"cat /sys/fs/cgroup{cg}/memory.max /sys/fs/cgroup{cg}/pids.max"
        ).stdout.split()
        assert files == [str(memory), str(tasks)]
        # lev ps shows the limits that apply, defaults included.
        info = row(bed, agent_id)
        assert info["memory_max"] == memory and info["tasks_max"] == tasks, info
        table = lev(bed, "ps").stdout
        line = next(ln for ln in table.splitlines() if ln.startswith(agent_id))
        assert re.search(rf"\S+/\S+G\s+\d+/{tasks}\s", line), line
    finally:
        lev(bed, "stop", agent_id)


def test_the_slice_caps_all_agents_together(bed: Testbed) -> None:
    mem = int(re.search(r"MemTotal:\s+(\d+) kB", bed.read_file("/proc/meminfo")).group(1)) * 1024
    cap = int(prop(bed, "leviath.slice", "MemoryMax"))
    # 80% of the RAM systemd saw when it loaded the slice, rounded to pages.
    assert 0.79 * mem < cap < 0.81 * mem, (cap, mem)
    assert prop(bed, "leviath.slice", "TasksMax").isdigit()


def test_lev_inspect_shows_the_default_limits_and_the_proxied_network(bed: Testbed) -> None:
    memory, tasks = expected(bed)
    home = bed.users["alice"].home
    bed.run(["mkdir", "-p", f"{home}/work/bp"], user="alice")
    bed.write_file(f"{home}/work/bp/blueprint.toml", '[agent]\nname = "bp"\ncommand = ["true"]\n')
    bed.run(["chown", "-R", "alice", f"{home}/work/bp"])
    out = lev(bed, "inspect", f"{home}/work/bp").stdout
    assert f"memory_max={memory}" in out and f"tasks_max={tasks}" in out, out
    assert "cpu_weight=50" in out
    assert "the machine's default applies" in out
    # Issue 30: the default network is the proxy, no longer the host's.
    assert "proxy (only lo; out through the daemon's proxy at 127.0.0.1:3128)" in out, out
    assert "shares the host network" not in out


@pytest.fixture
def small_machine(bed: Testbed) -> Iterator[Testbed]:
    meminfo = bed.read_file("/proc/meminfo")
    fake = re.sub(r"MemTotal:\s+\d+ kB", f"MemTotal:       {GIB // 1024} kB", meminfo)
    bed.write_file(FAKE_MEMINFO, fake)
    bed.run(["mount", "--bind", FAKE_MEMINFO, "/proc/meminfo"])
    # The service has a mount namespace of its own (its sandboxing): it sees
    # the bind from its next start.
    bed.run(["systemctl", "restart", "leviathd"])
    try:
        yield bed
    finally:
        bed.run(["umount", "/proc/meminfo"])
        bed.run(["systemctl", "restart", "leviathd"])


def test_a_memory_hog_with_the_defaults_dies_in_its_scope_and_the_daemon_and_others_live(
    small_machine: Testbed,
) -> None:
    bed = small_machine
    other = start(bed, "sleep", "300")
    try:
        shm = lev(bed, "run", "--", "sh", "-c", "grep ' /dev/shm ' /proc/self/mountinfo").stdout
        # Half of the agent's 256 MiB default, not half of the machine.
        assert "size=131072k" in shm, shm
        hog = "python3 -c \"b=[]\nwhile True: b.append(bytearray(8<<20))\""
        r = lev(bed, "run", "--", "sh", "-c", hog, check=False, timeout=120)
        assert r.returncode in (137, 128 + 9) or (
            r.returncode == 1 and "MemoryError" in r.stderr), r
        assert bed.run(["systemctl", "is-active", "leviathd"]).stdout.strip() == "active"
        time.sleep(0.5)
        assert row(bed, other)["state"] == "running"
    finally:
        lev(bed, "stop", other)
