"""Issue 10 §3: the documented rule for limits no config sets
(docs/configuration.md, "Limits by default"), checked against numbers
written out here."""

from __future__ import annotations

from leviathd import resource_defaults as rd
from leviathd.cli.inspect import render
from leviathd.sandbox.spec import with_default_limits
from tests.unit.test_container_options import eff, spec_for

GIB = 1 << 30


def test_the_rule_on_a_few_machines() -> None:
    assert rd.defaults(rd.MachineSize(16 * GIB, 4194304)) == {
        "memory_max": 4 * GIB, "tasks_max": 4096, "cpu_weight": 50}
    assert rd.defaults(rd.MachineSize(GIB, 32768)) == {
        "memory_max": 256 << 20, "tasks_max": 1638, "cpu_weight": 50}
    # Tiny machines still get the floors; odd sizes round down to a MiB.
    small = rd.defaults(rd.MachineSize(512 << 20, 4000))
    assert small["memory_max"] == 256 << 20 and small["tasks_max"] == 512
    assert rd.defaults(rd.MachineSize(3 * GIB + 12345, 10**6))["memory_max"] == 768 << 20


def test_a_configured_limit_is_kept_and_only_missing_ones_are_filled() -> None:
    size = rd.MachineSize(16 * GIB, 4194304)
    got = rd.fill({"memory_max": 64 << 20, "tasks_max": None, "cpu_quota": None,
                   "cpu_weight": None}, size)  # fmt: skip
    assert got == {"memory_max": 64 << 20, "tasks_max": 4096, "cpu_quota": None,
                   "cpu_weight": 50}  # fmt: skip


def test_this_machine_is_read_and_every_default_is_finite() -> None:
    size = rd.machine_size()
    assert size.memory > 0 and size.tasks > 0
    assert all(v > 0 for v in rd.defaults(size).values())


def test_tmpfs_mounts_are_half_the_agent_memory() -> None:
    assert rd.tmpfs_size({"memory_max": 256 << 20}) == 128 << 20
    assert rd.tmpfs_size({"memory_max": None}) is None


def test_inspect_shows_defaults_with_a_note_and_the_shared_network() -> None:
    spec = with_default_limits(spec_for(eff()))
    assert all(spec.limits[k] is not None for k in ("memory_max", "tasks_max", "cpu_weight"))
    text = render(spec)
    assert "memory_max=" in text and "the machine's default applies" in text
    assert "shares the host network: loopback services and abstract sockets reachable" in text
