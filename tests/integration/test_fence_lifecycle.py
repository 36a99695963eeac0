"""The namespace fence's life cycle through the real daemon (issue 4): scratch
folders never outlive their agent however it ends, running agents' folders are
never touched, and a fence that cannot be built follows `on_unavailable`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from journal_wait import journal_with
from testbed import Testbed

SCRATCH = "/var/lib/leviath/scratch"
CONFIG = """
[sandbox]
kind = "namespace"
{extra}

[resources]
memory_max = "96M"
tasks_max = 64
"""


def configure(bed: Testbed, extra: str = "") -> None:
    bed.write_file("/etc/leviath/config.toml", CONFIG.format(extra=extra))
    bed.run(["systemctl", "reload-or-restart", "leviathd"])


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.run(["systemctl", "start", "leviathd"])
    configure(testbed)
    testbed.run(["mkdir", "-p", "work"], user="alice")
    yield testbed


def lev(bed: Testbed, *args: str, user: str = "alice", check: bool = True, timeout: float = 60):
    cwd = f"{bed.users[user].home}/work"
    return bed.run(["lev", *args], user=user, cwd=cwd, check=check, timeout=timeout)


def start(bed: Testbed, *command: str) -> str:
    return lev(bed, "run", "--detach", "--", *command).stdout.strip()


def info(bed: Testbed, agent_id: str) -> dict:
    rows = json.loads(lev(bed, "ps", "--all", "--json").stdout)
    return next(r for r in rows if r["id"] == agent_id)


def wait_ended(bed: Testbed, agent_id: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = info(bed, agent_id)
        if row["state"] != "running":
            return row
        time.sleep(0.3)
    raise AssertionError(f"{agent_id} still running")


def scratch_exists(bed: Testbed, agent_id: str) -> bool:
    return bed.run(["test", "-d", f"{SCRATCH}/{agent_id}"], check=False).returncode == 0


def test_scratch_is_on_disk_out_of_every_users_reach_and_goes_after_a_normal_exit(
    bed: Testbed,
) -> None:
    agent_id = start(bed, "sh", "-c", "echo x > /tmp/in-tmp; echo y > ~/in-home; "
                     "stat -f -c %T ~ /tmp; sleep 2")  # fmt: skip
    time.sleep(0.5)
    # On disk: a root-owned empty mount point; the scratch filesystem (an
    # ext4 of its own, issue 33) is mounted in the agent's namespace only
    # (issue 20).
    st = bed.run(["stat", "-c", "%U %a", f"{SCRATCH}/{agent_id}"]).stdout.split()
    assert st == ["root", "700"]
    assert bed.run(["find", f"{SCRATCH}/{agent_id}", "-name", "in-*"]).stdout == ""
    assert wait_ended(bed, agent_id)["state"] == "exited"
    assert lev(bed, "logs", agent_id).stdout.count("ext2/ext3") == 2
    assert not scratch_exists(bed, agent_id)


def test_scratch_goes_after_lev_stop(bed: Testbed) -> None:
    agent_id = start(bed, "sleep", "300")
    time.sleep(0.3)
    assert scratch_exists(bed, agent_id)
    lev(bed, "stop", agent_id)
    assert wait_ended(bed, agent_id)["state"] == "stopped"
    assert not scratch_exists(bed, agent_id)


def test_scratch_goes_when_every_process_of_the_agent_is_killed(bed: Testbed) -> None:
    agent_id = start(bed, "sleep", "300")
    unit = info(bed, agent_id)["unit"]
    time.sleep(0.3)
    bed.run(["systemctl", "kill", "--signal=SIGKILL", unit])
    row = wait_ended(bed, agent_id)
    assert row["state"] in ("failed", "exited")
    assert not scratch_exists(bed, agent_id)


def test_scratch_goes_after_an_out_of_memory_kill(bed: Testbed) -> None:
    hog = "b = []\nwhile True: b.append(bytearray(8 << 20))"
    r = lev(bed, "run", "--", "python3", "-c", hog, check=False, timeout=120)
    assert r.returncode != 0
    rows = json.loads(lev(bed, "ps", "--all", "--json").stdout)
    row = [x for x in rows if x["command"][:2] == ["python3", "-c"]][-1]
    assert row["state"] != "running"
    assert not scratch_exists(bed, row["id"])
    assert bed.run(["systemctl", "is-active", "leviathd"]).stdout.strip() == "active"


def test_a_daemon_killed_and_restarted_sweeps_ended_agents_and_spares_running_ones(
    bed: Testbed,
) -> None:
    short = start(bed, "sleep", "2")
    long = start(bed, "sleep", "300")
    time.sleep(0.3)
    bed.run(["systemctl", "kill", "--signal=SIGKILL", "leviathd"])
    # Keep it down (Restart=on-failure would bring it back at once) while the
    # short agent ends: nobody is there to clean up after it.
    bed.run(["systemctl", "stop", "leviathd"])
    time.sleep(3)
    assert scratch_exists(bed, short)
    bed.run(["systemctl", "start", "leviathd"])
    assert wait_ended(bed, short)["state"] == "exited"
    assert not scratch_exists(bed, short)
    assert scratch_exists(bed, long) and info(bed, long)["state"] == "running"
    lev(bed, "stop", long)
    wait_ended(bed, long)
    assert not scratch_exists(bed, long)


def test_no_agent_sees_another_agents_scratch(bed: Testbed) -> None:
    other = start(bed, "sleep", "60")
    r = lev(bed, "run", "--", "sh", "-c", f"ls {SCRATCH}/{other} || ls {SCRATCH}", check=False)
    assert r.returncode != 0 and other not in r.stdout
    r = bed.run(["ls", f"{SCRATCH}/{other}"], user="bob", check=False)
    assert r.returncode != 0
    lev(bed, "stop", other)


@pytest.fixture
def no_namespaces(bed: Testbed) -> Iterator[None]:
    """A real host that refuses namespaces to the daemon: systemd's own
    RestrictNamespaces= seccomp filter, not a stand-in."""
    dropin = "/etc/systemd/system/leviathd.service.d/no-namespaces.conf"
    bed.write_file(dropin, "[Service]\nRestrictNamespaces=yes\n")
    bed.run(["systemctl", "daemon-reload"])
    bed.run(["systemctl", "restart", "leviathd"])
    yield
    bed.run(["rm", "-f", dropin])
    bed.run(["systemctl", "daemon-reload"])
    configure(bed)
    bed.run(["systemctl", "restart", "leviathd"])


def test_a_fence_that_cannot_be_built_fails_the_spawn_and_leaves_nothing(
    bed: Testbed, no_namespaces: None
) -> None:
    configure(bed, 'on_unavailable = "error"')
    before = bed.run(["ls", "/var/lib/leviath/agents"]).stdout
    r = lev(bed, "run", "--", "true", check=False)
    assert r.returncode != 0 and "namespace sandbox cannot be built" in r.stderr
    assert bed.run(["ls", "/var/lib/leviath/agents"]).stdout == before
    assert bed.run(["ls", SCRATCH]).stdout.strip() == ""


def test_on_unavailable_warn_runs_on_the_host_and_marks_the_agent(
    bed: Testbed, no_namespaces: None
) -> None:
    configure(bed, 'on_unavailable = "warn"')
    agent_id = lev(bed, "run", "--detach", "--", "true").stdout.strip()
    row = wait_ended(bed, agent_id)
    assert row["sandbox"] == "none" and "unsandboxed" in row["marks"]
    table = lev(bed, "ps", "--all").stdout
    assert "UNSANDBOXED" in next(line for line in table.splitlines() if agent_id in line)
    journal = journal_with(bed, ["LEVIATH_EVENT=sandbox-unavailable"], "running on the host")
    assert "running on the host" in journal
