"""Escape checks from inside a real agent started by the real daemon in the
test bed (issue 4): alice's agent runs tests/escape_probe.py and the tests
below assert, one threat each, what it could and could not do."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testbed import Testbed

SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- planted-by-the-bed-test"
PROBE = (Path(__file__).resolve().parents[1] / "escape_probe.py").read_text()
PORT = 47011
CALLER_ENV = {
    "GITHUB_TOKEN": "ghp_planted",
    "OP_SERVICE_ACCOUNT_TOKEN": "ops_planted",
    "AWS_SECRET_ACCESS_KEY": "aws_planted",
    "SSH_AUTH_SOCK": "/run/user/1001/ssh",
    "DOCKER_HOST": "unix:///var/run/docker.sock",
    "NPM_TOKEN": "npm_planted",
    "LANG": "C.UTF-8",
}


@pytest.fixture(scope="module")
def world(testbed: Testbed) -> Iterator[dict[str, Any]]:
    bed = testbed
    alice, bob = bed.users["alice"], bed.users["bob"]
    h = alice.home
    setup = f"""
        set -e
        mkdir -p {h}/.ssh {h}/.claude {h}/app
        printf '%s' '{SECRET}' > {h}/.ssh/id_ed25519
        chmod 600 {h}/.ssh/id_ed25519
        echo 'github.com ssh-ed25519 AAAA' > {h}/.ssh/known_hosts
        printf '[user]\\n  name = Alice A\\n  email = alice@example.org\\n' > {h}/.gitconfig
        ln -sf {h}/.ssh/id_ed25519 {h}/app/abs-link
        ln -sf ../.ssh/id_ed25519 {h}/app/rel-link
        cat > {h}/app/probe.py
    """
    bed.run(setup, user="alice", input=PROBE)
    bed.run(f"echo diary > {bob.home}/diary", user="bob")
    bed.run("mkdir -p /opt/suid && cp /usr/bin/id /opt/suid/id && chmod 4755 /opt/suid/id")
    bed.run("echo host > /tmp/host-only-marker")
    server = subprocess.Popen(
        bed.command(["python3", "-c",
                     "import socket,time\ns=socket.create_server(('127.0.0.1',"
                     f"{PORT}))\ns.listen(8)\ntime.sleep(600)"]),
    )
    bed.run("systemctl start leviathd")
    daemon_pid = int(bed.run(["systemctl", "show", "-P", "MainPID", "leviathd"]).stdout)
    cfg = json.dumps({
        "home": h, "workdir": f"{h}/app", "other_home": bob.home,
        "suid_dir": "/opt/suid", "suid_id": "/opt/suid/id", "port": PORT,
        "daemon_pid": daemon_pid,
    })  # fmt: skip
    yield {"bed": bed, "cfg": cfg, "home": h, "uid": alice.uid}
    server.kill()
    server.wait()


def probe(world: dict[str, Any], *, network: bool) -> dict[str, Any]:
    bed: Testbed = world["bed"]
    bed.write_file(
        "/etc/leviath/config.toml",
        f'[sandbox]\nkind = "namespace"\nnetwork = {"true" if network else "false"}\n',
    )
    bed.run(["systemctl", "reload", "leviathd"])
    r = bed.run(["lev", "run", "--", "python3", "probe.py", world["cfg"]], user="alice",
                cwd=f"{world['home']}/app", env=CALLER_ENV)  # fmt: skip
    result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def inside(world: dict[str, Any]) -> dict[str, Any]:
    return probe(world, network=True)


@pytest.fixture(scope="module")
def offline(world: dict[str, Any]) -> dict[str, Any]:
    return probe(world, network=False)


def test_the_users_private_key_cannot_be_read_by_path_link_or_proc_root(
    inside: dict[str, Any],
) -> None:
    for how in ("key_by_path", "key_via_abs_link", "key_via_rel_link",
                "key_via_proc1_root", "key_via_proc_self_root",
                "key_via_daemon_root"):  # fmt: skip
        assert inside[how].startswith("err:"), (how, inside[how])
        assert SECRET not in inside[how]


def test_only_the_agents_own_processes_are_visible(inside: dict[str, Any]) -> None:
    # PID 1 is the fence's reaper, the agent is PID 2: the daemon, systemd and
    # every other agent are in no /proc the agent can see.
    assert inside["pids"] == [1, 2]


def test_ssh_folder_holds_only_known_hosts_and_gitconfig_is_absent(inside: dict[str, Any]) -> None:
    assert inside["ssh_dir"] == "ok:['known_hosts']"
    assert inside["known_hosts"].startswith("ok:github.com")
    assert inside["gitconfig"] == "err:ENOENT"


def test_another_users_home_is_absent(inside: dict[str, Any]) -> None:
    assert inside["other_home"] == "err:ENOENT"


def test_tmp_is_private(inside: dict[str, Any], world: dict[str, Any]) -> None:
    assert "host-only-marker" not in inside["tmp_listing"]
    assert inside["write_tmp"] == "ok"
    bed: Testbed = world["bed"]
    assert bed.run(["test", "-e", "/tmp/agent-was-here"], check=False).returncode != 0


def test_workdir_writes_persist_and_writes_elsewhere_fail(
    inside: dict[str, Any], world: dict[str, Any]
) -> None:
    bed: Testbed = world["bed"]
    assert inside["write_workdir"] == "ok"
    assert bed.run(["cat", f"{world['home']}/app/agent-was-here"]).stdout == "x"
    for place in ("/usr/agent", "/etc/agent", "/opt/agent", "/agent", "/opt/suid/agent"):
        assert inside["write " + place].startswith("err:"), place
    # Home writes land in scratch, not in the real home.
    assert bed.run(["test", "-e", f"{world['home']}/agent-was-here"], check=False).returncode != 0


def test_with_network_the_beds_loopback_is_reachable(inside: dict[str, Any]) -> None:
    assert inside["tcp_host_loopback"] == "ok"


def test_without_network_only_lo_exists_and_the_hosts_loopback_is_unreachable(
    offline: dict[str, Any],
) -> None:
    assert offline["interfaces"] == ["lo"]
    assert offline["tcp_host_loopback"].startswith("err:")


def test_no_capabilities_no_new_privileges_and_setuid_does_nothing(inside: dict[str, Any]) -> None:
    assert inside["CapEff"] == "0000000000000000"
    assert inside["CapBnd"] == "0000000000000000"
    assert inside["NoNewPrivs"] == "1"
    assert inside["suid_euid"] == str(inside["uid"][0]) != "0"


def test_mount_unshare_setns_and_ptrace_fail(inside: dict[str, Any]) -> None:
    for what in ("mount", "unshare_mnt", "unshare_user", "setns_self", "setns_pid1",
                 "ptrace_pid1"):  # fmt: skip
        assert inside[what].startswith("err:"), (what, inside[what])


def test_secret_variables_from_the_callers_environment_are_absent(
    inside: dict[str, Any], world: dict[str, Any]
) -> None:
    env = inside["env"]
    for name in CALLER_ENV:
        if name != "LANG":
            assert name not in env, name
    assert env["LANG"] == "C.UTF-8"
    assert env["HOME"] == world["home"] and env["USER"] == "alice"
    assert env.get("GIT_AUTHOR_EMAIL") == "alice@example.org"


def test_the_agent_runs_as_alice_in_its_workdir(
    inside: dict[str, Any], world: dict[str, Any]
) -> None:
    assert inside["uid"] == [world["uid"]] * 3
    assert inside["cwd"].endswith("/app")


# Issue 19: each promise below is checked against names written here from the
# spec, never against the code's own tables, so that dropping an entry from the
# code fails a test.


@pytest.mark.parametrize("call", ["keyctl_join", "add_key", "request_key"])
def test_the_kernel_keyring_is_out_of_reach(inside: dict[str, Any], call: str) -> None:
    # Without the filter: keyctl succeeds, add_key succeeds, request_key says ENOKEY.
    assert inside[call] == "err:EPERM", (call, inside[call])


@pytest.mark.parametrize(
    "call",
    ["bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
     "io_uring_register", "tioclinux", "tiocsti_high_bits"],
)
def test_large_kernel_surfaces_and_terminal_ioctls_are_refused(
    inside: dict[str, Any], call: str
) -> None:
    # Issue 10 §2: the same table as the container kind's profile.
    assert inside[call] == "err:EPERM", (call, inside[call])


def test_typing_into_the_controlling_terminal_is_refused(inside: dict[str, Any]) -> None:
    # dev.tty.legacy_tiocsti=1 here, so the kernel itself would allow it on
    # the child's own controlling pty: only the filter refuses it.
    assert inside["tiocsti_ctty"] == "err:EPERM"


@pytest.mark.parametrize(
    "flag", ["NEWNS", "NEWCGROUP", "NEWUTS", "NEWIPC", "NEWUSER", "NEWPID", "NEWNET"]
)
def test_clone_with_a_new_namespace_is_refused(inside: dict[str, Any], flag: str) -> None:
    assert inside["clone " + flag] == "err:EPERM", inside["clone " + flag]


def test_the_root_is_one_read_only_tmpfs_and_the_old_root_is_gone(
    inside: dict[str, Any],
) -> None:
    roots = [m for m in inside["mounts"] if m["target"] == "/"]
    assert len(roots) == 1, roots
    assert roots[0]["fstype"] == "tmpfs"
    assert "ro" in roots[0]["options"].split(",")
    targets = {m["target"] for m in inside["mounts"]}
    # Nothing of the host's own world is attached: a root that was not
    # detached after pivot_root shows up as a second "/" with the bed's
    # /sys, /run, /var and other homes below it.
    for host_only in ("/sys", "/sys/fs/cgroup", "/run", "/run/systemd", "/run/dbus", "/var",
                      "/var/lib/leviath", "/boot", "/root", "/home/bob"):  # fmt: skip
        assert host_only not in targets, sorted(targets)
