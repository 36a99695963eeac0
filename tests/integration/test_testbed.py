"""The test bed itself: a real systemd, bus and polkit, and a host left as it was."""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

import pytest
from testbed import Testbed, cgroups

pytestmark = pytest.mark.testbed


def _host_cgroup_roots() -> list[Path]:
    return [Path(p) for p in ("/sys/fs/cgroup", *map(str, Path("/sys/fs/cgroup").glob("*")))]


def _root_listing() -> dict[Path, list[str]]:
    # Other test beds on this machine (other sessions) come and go at the
    # roots while this test runs: their run folders are not ours to judge.
    return {
        p: sorted(n for n in os.listdir(p) if not n.startswith(cgroups.PREFIX))
        for p in _host_cgroup_roots()
    }


def _hierarchy_ids() -> dict[str, str]:
    lines = Path("/proc/cgroups").read_text().splitlines()[1:]
    return {f[0]: f[1] for f in (line.split() for line in lines)}


def test_systemd_reaches_running_with_no_failed_unit() -> None:
    # A bed of its own: the session's bed is shared, and a test of the
    # service may legitimately leave leviathd.service failed in it.
    with Testbed() as bed:
        state = bed.run(["systemctl", "is-system-running"], check=False).stdout.strip()
        failed = bed.run(["systemctl", "--failed", "--plain", "--no-legend"]).stdout
        assert (state, failed.strip()) == ("running", "")
        assert bed.run(["cat", "/proc/1/comm"]).stdout.strip() == "systemd"
        assert bed.boot_seconds is not None  # how long is bench's, not a limit here


def test_polkit_allows_root_and_asks_an_unprivileged_user_to_authenticate(
    testbed: Testbed,
) -> None:
    check = "pkcheck --action-id org.freedesktop.systemd1.manage-units --process $$"
    as_root = testbed.run(check, check=False)
    as_carol = testbed.run(check, user="carol", check=False)
    assert as_root.returncode == 0, as_root.stderr
    assert as_carol.returncode != 0
    assert "requires authentication" in as_carol.stderr


def test_a_transient_scope_gets_its_memory_and_tasks_limits_in_the_bed(testbed: Testbed) -> None:
    r = testbed.run(
        ["systemd-run", "--scope", "-p", "MemoryMax=100M", "-p", "TasksMax=20", "sh", "-c",
         'g=$(grep :memory: /proc/self/cgroup | cut -d: -f3); '
         'cat /sys/fs/cgroup/memory$g/memory.limit_in_bytes; '
         'g=$(grep :pids: /proc/self/cgroup | cut -d: -f3); cat /sys/fs/cgroup/pids$g/pids.max'],
    )  # fmt: skip
    assert r.stdout.split() == ["104857600", "20"]


def test_a_user_added_inside_does_not_exist_on_the_host(testbed: Testbed) -> None:
    name = "tb" + secrets.token_hex(4)
    testbed.add_user(name, ["leviath"])
    assert testbed.run(["id", "-nG", name]).stdout.split() == [name, "leviath"]
    assert name not in Path("/etc/passwd").read_text()
    assert not Path("/home", name).exists()


def test_commands_run_as_the_user_with_a_login_like_environment(testbed: Testbed) -> None:
    r = testbed.run('id -un; id -Gn; echo "$HOME $USER"; pwd', user="dave")
    lines = r.stdout.splitlines()
    assert lines[0] == "dave"
    assert set(lines[1].split()) == {"dave", "leviath", "leviath-admin"}
    assert lines[2:] == ["/home/dave dave", "/home/dave"]


def test_the_project_is_installed_and_usable_by_an_unprivileged_user(testbed: Testbed) -> None:
    # lev as the packages write it (packaging/slim-entry-point.sh), the daemon plain.
    wrapper = testbed.run(["cat", "/usr/bin/lev"], user="carol").stdout
    assert wrapper.startswith("#!/opt/leviath-dev/venv/bin/python -IS\n"), wrapper
    assert "from leviathd.cli.main import main" in wrapper
    wrapper = testbed.run(["cat", "/usr/bin/leviathd"], user="carol").stdout
    assert wrapper.startswith("#!/opt/leviath-dev/venv/bin/python\n"), wrapper
    assert "from leviathd.daemon import main" in wrapper
    where = testbed.run(
        ["/opt/leviath-dev/venv/bin/python", "-c", "import leviathd; print(leviathd.__file__)"],
        user="carol",
    )
    assert where.stdout.startswith("/usr/lib/leviathd-test/")


def test_booting_and_stopping_a_bed_leaves_the_host_as_it_was() -> None:
    # A second, short-lived bed, so the hazards of docs/testbed.md are checked
    # around a whole boot and shutdown: /tmp wiped, the cgroup tmpfs turned
    # read-only, slices created at hierarchy roots, new v1 hierarchies.
    marker = Path("/tmp") / f"leviath-testbed-marker-{secrets.token_hex(4)}"
    marker.write_text("still here")
    roots_before = _root_listing()
    ids_before = _hierarchy_ids()
    try:
        with Testbed() as bed:
            assert bed.run(["systemctl", "is-system-running"]).stdout.strip() == "running"
            bed.run(["systemd-run", "--scope", "true"])
            created = list(bed._cgroups)
        assert marker.read_text() == "still here"
        assert "rw" in [
            line.split()[3].split(",")[0]
            for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[1] == "/sys/fs/cgroup"
        ]
        probe = Path("/sys/fs/cgroup") / f".testbed-probe-{secrets.token_hex(4)}"
        probe.mkdir()
        probe.rmdir()
        assert _root_listing() == roots_before
        for names in roots_before.values():
            assert not {"system.slice", "user.slice", "init.scope"} & set(names)
        assert _hierarchy_ids() == ids_before
        assert created and not [c for c in created if c.exists()]
        assert not [h.current / bed.name for h in cgroups.hierarchies()
                    if (h.current / bed.name).exists()]  # fmt: skip
    finally:
        marker.unlink(missing_ok=True)


def _declared_actions() -> list[str]:
    repo = Path(__file__).resolve().parents[2]
    ids: list[str] = []
    for policy in sorted((repo / "polkit").glob("*.policy")):
        ids += re.findall(r'<action\s+id="([^"]+)"', policy.read_text())
    return ids


def test_every_polkit_action_of_the_checkout_is_known_to_polkitd_in_the_bed(
    testbed: Testbed,
) -> None:
    actions = _declared_actions()
    if not actions:
        pytest.skip("polkit/ declares no actions yet")
    known = testbed.run(["pkaction"]).stdout.split()
    assert [a for a in actions if a not in known] == []
