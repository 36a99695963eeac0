"""`lev -H [USER@]HOST` (issue 46): over the bed's sshd (on the bed's own
loopback) to the bed's bus through systemd-stdio-bridge, as `systemctl -H`.
What alice sees there is what `lev ps` shows her here; bob, over ssh as
himself, is refused alice's agent exactly as he is locally: the far bus
knows the ssh login's user (the bridge's own connection), and that
machine's polkit decides; nothing lev says about itself counts."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

pytestmark = pytest.mark.testbed

KEYS = "/etc/ssh/leviath-test-h"
SSHD_CONFIG = f"""Port 22
ListenAddress 127.0.0.1
HostKey /root/sshtest-h/host
AuthorizedKeysFile {KEYS}/%u
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM yes
PidFile none
"""
USERS = ("alice", "bob")


def ssh_config(home: str) -> str:
    return (f"Host localhost\n  IdentityFile {home}/.ssh/lev_h\n"
            f"  UserKnownHostsFile {home}/.ssh/lev_h_known\n"
            "  StrictHostKeyChecking yes\n  BatchMode yes\n  ConnectTimeout 20\n")


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    bed.run(f"rm -rf /root/sshtest-h {KEYS} && mkdir -p /root/sshtest-h {KEYS} /run/sshd "
            "&& ssh-keygen -q -t ed25519 -N '' -f /root/sshtest-h/host")
    host_key = bed.run(["cat", "/root/sshtest-h/host.pub"]).stdout.split()
    for user in USERS:
        home = bed.users[user].home
        bed.run("mkdir -p ~/.ssh ~/remotew && chmod 700 ~/.ssh && rm -f ~/.ssh/lev_h* && "
                "ssh-keygen -q -t ed25519 -N '' -f ~/.ssh/lev_h && cat > ~/.ssh/config",
                user=user, input=ssh_config(home))
        bed.write_file(f"{home}/.ssh/lev_h_known", f"localhost {host_key[0]} {host_key[1]}\n")
        bed.run(["chown", f"{user}:", f"{home}/.ssh/lev_h_known"])
        bed.run(f"cat {home}/.ssh/lev_h.pub >> {KEYS}/{user} && chmod 644 {KEYS}/{user}")
    # alice may also log in as bob: then the far side must see bob, not her.
    bed.run(f"cat {bed.users['alice'].home}/.ssh/lev_h.pub >> {KEYS}/bob")
    bed.write_file("/root/sshtest-h/sshd_config", SSHD_CONFIG)
    sshd = subprocess.Popen(bed.command(["/usr/sbin/sshd", "-D", "-e", "-f",
                                         "/root/sshtest-h/sshd_config"]),
                            stderr=subprocess.DEVNULL)
    try:
        bed.start_service("leviathd.service")
        deadline = time.monotonic() + 30  # sshd listening: waited for, bounded
        while bed.run(["ssh", "alice@localhost", "true"], user="alice",
                      check=False).returncode != 0:
            assert time.monotonic() < deadline, "the bed's sshd did not answer"
            time.sleep(0.3)
        yield bed
    finally:
        sshd.kill()
        sshd.wait()
        for user in USERS:
            bed.run("rm -f ~/.ssh/config ~/.ssh/lev_h ~/.ssh/lev_h.pub ~/.ssh/lev_h_known",
                    user=user, check=False)
        bed.run(["rm", "-rf", "/root/sshtest-h", KEYS])


def test_lev_h_shows_what_lev_ps_shows_and_polkit_decides_as_locally(bed: Testbed) -> None:
    cwd = f"{bed.users['alice'].home}/remotew"
    agent_id = bed.run(["lev", "run", "--detach", "--", "sleep", "120"], user="alice",
                       cwd=cwd).stdout.strip()
    try:
        local = json.loads(bed.run(["lev", "ps", "--json"], user="alice").stdout)
        far = bed.run(["lev", "-H", "alice@localhost", "ps", "--json"], user="alice")
        remote = json.loads(far.stdout)
        # The live figures (memory, tasks) move between two calls; the rest is the same.
        def steady(rows: list[dict[str, object]]) -> list[dict[str, object]]:
            return [{k: v for k, v in r.items() if k not in ("memory", "tasks")} for r in rows]
        assert steady(remote) == steady(local), (far.stderr, remote, local)
        assert agent_id in {r["id"] for r in remote}
        table = bed.run(["lev", "--host=alice@localhost", "ps"], user="alice").stdout
        assert agent_id in table and "sleep" in table, table
        # -M: systemd's name for this machine's own system bus, reached as a
        # container's is (the bridge enters its namespaces: root, as
        # systemctl -M on systemd 252).
        machine = bed.run(["lev", "-M", ".host", "ps", "--json"])
        assert steady(json.loads(machine.stdout)) == steady(
            json.loads(bed.run(["lev", "ps", "--json"]).stdout)), machine
        assert agent_id in machine.stdout

        # bob, as himself over ssh: refused as locally, and alice's agent runs on.
        here = bed.run(["lev", "stop", agent_id], user="bob", check=False)
        there = bed.run(["lev", "-H", "bob@localhost", "stop", agent_id], user="bob",
                        check=False)
        assert here.returncode != 0 and there.returncode == here.returncode, (here, there)
        assert there.stderr == here.stderr, (here.stderr, there.stderr)
        # bob holds no key for alice's login: nowhere.
        forged = bed.run(["lev", "-H", "alice@localhost", "stop", agent_id], user="bob",
                         check=False)
        assert forged.returncode != 0, forged
        # alice logged in as bob is bob there, whoever runs lev: she sees bob's
        # agents (not hers) and is refused her own agent, as bob is.
        as_bob = json.loads(bed.run(["lev", "-H", "bob@localhost", "ps", "--json"],
                                    user="alice").stdout)
        assert steady(as_bob) == steady(json.loads(
            bed.run(["lev", "ps", "--json"], user="bob").stdout)), as_bob
        assert agent_id not in {r["id"] for r in as_bob}, as_bob
        her_as_bob = bed.run(["lev", "-H", "bob@localhost", "stop", agent_id], user="alice",
                             check=False)
        assert her_as_bob.returncode == here.returncode, her_as_bob
        assert her_as_bob.stderr == here.stderr, her_as_bob.stderr
        still = json.loads(bed.run(["lev", "ps", "--json"], user="alice").stdout)
        assert agent_id in {r["id"] for r in still}, still

        # What ssh cannot carry is refused before anything starts.
        run = bed.run(["lev", "-H", "alice@localhost", "run", "--", "true"], user="alice",
                      check=False)
        assert run.returncode == 2 and "ps, stop, stats" in run.stderr, run
        bad = bed.run(["lev", "-H", "-oProxyCommand", "ps"], user="alice", check=False)
        assert bad.returncode == 2 and "not a host name" in bad.stderr, bad

        # And alice stops her own agent from afar.
        bed.run(["lev", "-H", "alice@localhost", "stop", agent_id], user="alice")
    finally:
        bed.run(["lev", "stop", agent_id], user="alice", check=False)
