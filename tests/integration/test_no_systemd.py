"""leviathd where systemd is not PID 1 (issue 5): podman alone fences agents,
through the same bus API, and the daemon says what it cannot offer.

The bed is booted without systemd (`Testbed(systemd=False)`): PID 1 is a small
init that starts only the system bus; polkitd and leviathd are started by
hand, as an administrator would in such a place. There is no journald and
no /run/systemd/system. The image is the busybox one of test_container.py.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator
from subprocess import CompletedProcess

import pytest
from podman_list import podman
from test_container import BUILD_IMAGE, IMAGE
from testbed import Testbed

pytestmark = pytest.mark.testbed

CHECKOUT = __file__.rsplit("/tests/", 1)[0]
LEVIATHD_LOG = "/run/leviathd.log"
NOTICE = (
    "systemd is not PID 1: agents run in podman containers only; no scopes, no "
    "systemctl/journalctl for agents, logs in /var/lib/leviath/logs"
)


def _wait(bed: Testbed, cmd: str, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if bed.run(cmd, check=False).returncode == 0:
            return
        time.sleep(0.2)
    log = bed.run(f"cat {LEVIATHD_LOG} /run/polkitd.log", check=False).stdout
    raise AssertionError(f"{what} did not come up:\n{log}")


@pytest.fixture(scope="module")
def bed() -> Iterator[Testbed]:
    # (Where the bed cannot boot, tests/conftest.py skips or fails the test.)
    bed = Testbed(systemd=False)
    try:
        bed.start()
        bed.wait_running()
        bed.install_project(CHECKOUT)
        bed.add_standard_users()
        r = bed.run(BUILD_IMAGE, check=False, timeout=300)
        if r.returncode == 3:
            pytest.skip(r.stderr.strip())
        assert r.returncode == 0, r.stderr
        bed.write_file(
            "/etc/leviath/config.toml",
            f'[sandbox]\nimage = "{IMAGE}"\n[resources]\nmemory_max = "256M"\ntasks_max = 64\n',
        )
        for user in ("alice", "carol"):
            bed.run(["mkdir", "-p", "cwork"], user=user)
        bed.run(["mkdir", "-p", "/root/cwork"])
        bed.run("setsid -f /usr/lib/polkit-1/polkitd --no-debug >/run/polkitd.log 2>&1")
        _wait(bed, "busctl --system status org.freedesktop.PolicyKit1 >/dev/null", "polkitd")
        bed.run(f"setsid -f leviathd >{LEVIATHD_LOG} 2>&1")
        _wait(bed, "busctl --system status org.leviath.Manager1 >/dev/null", "leviathd")
        yield bed
    finally:
        bed.stop()


def lev(
    bed: Testbed, user: str, *args: str, check: bool = True, timeout: float = 120
) -> CompletedProcess[str]:
    cwd = "/root/cwork" if user == "root" else f"{bed.users[user].home}/cwork"
    return bed.run(["lev", *args], user=user, cwd=cwd, check=check, timeout=timeout)


def row(bed: Testbed, agent_id: str) -> dict[str, object]:
    rows = json.loads(lev(bed, "root", "ps", "--json", "--all").stdout)
    return next(r for r in rows if r["id"] == agent_id)


def containers(bed: Testbed, agent_id: str) -> list[str]:
    out = podman(bed, "ps", "-a", "--filter", f"label=org.leviath.agent={agent_id}",
                 "--format", "{{.Names}}")
    return out.split()


def wait_for(check: object, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.3)
    raise AssertionError(what)


def test_the_bed_really_has_no_systemd_and_the_daemon_says_what_it_cannot_offer(
    bed: Testbed,
) -> None:
    assert bed.run("test -e /run/systemd/system", check=False).returncode != 0
    assert bed.run("test -e /run/systemd/journal/socket", check=False).returncode != 0
    assert bed.run(["cat", "/proc/1/comm"]).stdout.strip() != "systemd"
    assert NOTICE in bed.read_file(LEVIATHD_LOG)


@pytest.mark.parametrize("user", ["root", "alice"])
def test_lev_run_prints_the_output_of_an_agent_that_ran_in_a_podman_container(
    bed: Testbed, user: str
) -> None:
    r = lev(bed, user, "run", "--", "sh", "-c", "echo hello; hostname; exit 3", check=False)
    assert r.returncode == 3, (r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert lines[0] == "hello"
    m = re.fullmatch(r"leviath-([0-9a-f]{8})-[0-9a-f]{12}", lines[1])
    assert m, r.stdout  # the container's hostname: its name
    agent = row(bed, m.group(1))
    assert agent["sandbox"] == "container" and agent["exit_status"] == 3, agent
    assert "no-systemd" in agent["marks"], agent  # type: ignore[operator]
    human = lev(bed, user, "ps", "--all").stdout
    assert "no-systemd" in next(ln for ln in human.splitlines() if m.group(1) in ln)
    # Its output is in its log file (root's, 0600), and lev logs reads it.
    wait_for(lambda: not containers(bed, m.group(1)), "the container outlived the agent")
    logs = lev(bed, user, "logs", m.group(1)).stdout
    assert logs.splitlines()[:2] == lines[:2], logs
    st = bed.run(["stat", "-c", "%U %a", f"/var/lib/leviath/logs/{m.group(1)}.log"]).stdout
    assert st.split() == ["root", "600"]


def test_a_user_polkit_refuses_is_refused_without_systemd_too(bed: Testbed) -> None:
    r = lev(bed, "carol", "run", "--", "echo", "hello", check=False)
    assert r.returncode != 0 and "hello" not in r.stdout
    assert "not authorized" in r.stderr.lower() or "denied" in r.stderr.lower(), r.stderr


def test_lev_stop_ends_a_long_agent_and_removes_its_container(bed: Testbed) -> None:
    out = lev(bed, "alice", "run", "--detach", "--", "sh", "-c", "echo started; sleep 300")
    agent_id = out.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", agent_id), out.stdout
    assert containers(bed, agent_id), "no container while the agent runs"
    agent = row(bed, agent_id)
    assert agent["state"] == "running"
    # MEM and TASKS come from the agent's own cgroup (the container's
    # processes sit below it), not from a unit.
    assert isinstance(agent["tasks"], int) and agent["tasks"] >= 2, agent
    assert isinstance(agent["memory"], int) and agent["memory"] > 0, agent
    cgroup = f"/sys/fs/cgroup/pids/leviath.slice/{agent['unit']}"
    assert bed.run(f"ls -d {cgroup}/libpod-*", check=False).returncode == 0
    wait_for(lambda: "started" in lev(bed, "alice", "logs", agent_id).stdout, "no output logged")
    lev(bed, "alice", "stop", agent_id)
    wait_for(lambda: row(bed, agent_id)["state"] != "running", "the agent still runs")
    assert row(bed, agent_id)["state"] == "stopped"
    wait_for(lambda: not containers(bed, agent_id), "its container was not removed")
    wait_for(lambda: bed.run(["test", "-e", cgroup], check=False).returncode != 0,
             "its cgroup was not removed")  # fmt: skip
    assert "sleep 300" not in bed.run(["ps", "-eo", "args"]).stdout


def _daemon_pid(bed: Testbed) -> int:
    out = bed.run(["busctl", "--system", "call", "org.freedesktop.DBus", "/org/freedesktop/DBus",
                   "org.freedesktop.DBus", "GetConnectionUnixProcessID", "s",
                   "org.leviath.Manager1"]).stdout  # fmt: skip
    return int(out.split()[1])


def test_an_agent_outlives_a_killed_daemon_and_the_next_one_adopts_it_and_cleans_up(
    bed: Testbed,
) -> None:
    # It ends when told (a file in its workdir), not on a timer a slow restart could miss.
    go = f"{bed.users['alice'].home}/cwork/go-{secrets.token_hex(4)}"
    out = lev(bed, "alice", "run", "--detach", "--", "sh", "-c",
              f"while [ ! -e {go} ]; do sleep 0.2; done; exit 5")  # fmt: skip
    agent_id = out.stdout.strip()
    assert containers(bed, agent_id)
    old = _daemon_pid(bed)
    bed.run(["kill", "-9", str(old)])
    bed.run(f"setsid -f leviathd >>{LEVIATHD_LOG} 2>&1")
    # The new daemon, not the dying one whose name the bus may still list.
    _wait(bed, f"pid=$(busctl --system status org.leviath.Manager1 2>/dev/null | "
               f"sed -n 's/^PID=//p'); [ -n \"$pid\" ] && [ \"$pid\" != {old} ]",
          "the new leviathd")  # fmt: skip
    # Found again by its cgroup, named like its scope: still running, not failed.
    assert row(bed, agent_id)["state"] == "running"
    assert "1 agents adopted" in bed.read_file(LEVIATHD_LOG)
    bed.run(["touch", go], user="alice")
    wait_for(lambda: row(bed, agent_id)["state"] != "running", "the agent did not end")
    assert row(bed, agent_id)["exit_status"] == 5
    wait_for(lambda: not containers(bed, agent_id), "its container was not removed")


def test_lev_logs_follow_prints_lines_as_they_come_and_returns_when_the_agent_ends(
    bed: Testbed,
) -> None:
    out = lev(bed, "alice", "run", "--detach", "--", "sh", "-c",
              "echo one; sleep 2; echo two; sleep 1; echo three")  # fmt: skip
    agent_id = out.stdout.strip()
    t0 = time.monotonic()
    r = lev(bed, "alice", "logs", "--follow", agent_id, timeout=60)
    # It waited for the lines written after it started, then ended with the agent.
    assert r.stdout.splitlines() == ["one", "two", "three"], r.stdout
    assert time.monotonic() - t0 >= 2
    assert row(bed, agent_id)["state"] == "exited"
