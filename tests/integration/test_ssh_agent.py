"""Issue 15 §3, SSH: with a `kind = "ssh"` credential (alice's own key, in
her ~/.ssh, named by her user config), the agent's SSH_AUTH_SOCK is a socket
the daemon serves; it signs with the key only for a session bound (OpenSSH's
session-bind@openssh.com) to a host the credential covers. Two sshd on the
bed's loopback: port 2222 (covered) and 2223 (another host key, not
covered). The agent logs in and clones/pushes over ssh with no key in its
sandbox; the uncovered host gets no signature; a client that sends no bind,
or a bind it cannot have, gets none; the key file cannot be read from inside."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator

import pytest
from loop_agent import LOOP
from loop_agent import LoopAgent as Agent
from testbed import Testbed

pytestmark = pytest.mark.testbed

BLUEPRINT = """
[agent]
name = "sshcred"
description = "runs the test's ssh commands"
command = ["sh", "loop.sh"]
"""
MACHINE = """
[sandbox]
kind = "namespace"
# The host's network, chosen (the sshd is on the bed's loopback; the
# default is the proxy since issue 30).
network = true
"""


def user_config(home: str) -> str:
    return f"""
[credentials.sshtest]
kind = "ssh"
hosts = ["127.0.0.1:2222"]
secret_file = "{home}/.ssh/lev_test"
"""


def sshd_config(port: int, key: str) -> str:
    return f"""
Port {port}
ListenAddress 127.0.0.1
HostKey /root/sshtest/{key}
AuthorizedKeysFile /etc/ssh/leviath-test/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM yes
PidFile none
"""


# The attacker, in the agent, speaking the agent protocol itself.
RAW = r"""
import os, socket, struct, json
def msg(s, body):
    s.sendall(struct.pack(">I", len(body)) + body)
    n = struct.unpack(">I", s.recv(4))[0]
    data = b""
    while len(data) < n:
        data += s.recv(n - len(data))
    return data
def string(b):
    return struct.pack(">I", len(b)) + b
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["SSH_AUTH_SOCK"])
out = {}
ids = msg(s, bytes([11]))
count = struct.unpack(">I", ids[1:5])[0]
blen = struct.unpack(">I", ids[5:9])[0]
blob = ids[9:9 + blen]
out["keys"] = count
out["sign_unbound"] = msg(s, bytes([13]) + string(blob) + string(b"anything") + b"\0\0\0\0")[0]
hostkey = open("/etc/ssh/ssh_known_hosts").read().split()[2]
import base64
bind = (string(b"session-bind@openssh.com") + string(base64.b64decode(hostkey)) +
        string(b"s" * 32) + string(string(b"ssh-ed25519") + string(b"x" * 64)) + b"\0")
out["forged_bind"] = msg(s, bytes([27]) + bind)[0]
out["sign_after"] = msg(s, bytes([13]) + string(blob) + string(b"anything") + b"\0\0\0\0")[0]
out["add_key"] = msg(s, bytes([17]) + string(b"ssh-ed25519"))[0]
print(json.dumps(out))
"""


def ssh_records(bed: Testbed, agent_id: str) -> list[dict[str, str]]:
    out = bed.run(["journalctl", "--no-pager", "-o", "json", f"LEVIATH_AGENT={agent_id}",
                   "LEVIATH_TOOL=ssh_sign"]).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    h = bed.users["alice"].home
    old = bed.run(["cat", "/etc/leviath/config.toml"], check=False)
    bed.run(f"mkdir -p {h}/sshw/.req {h}/sshbp {h}/.ssh {h}/.config/leviath "
            f"&& cat > {h}/sshbp/blueprint.toml && chmod 700 {h}/.ssh "
            f"&& rm -f {h}/.ssh/lev_test* && ssh-keygen -q -t ed25519 -N '' -f {h}/.ssh/lev_test",
            user="alice", input=BLUEPRINT)
    bed.run(["sh", "-c", "cat > loop.sh"], user="alice", cwd=f"{h}/sshw", input=LOOP)
    bed.write_file(f"{h}/.config/leviath/config.toml", user_config(h))
    bed.run(["chown", "alice:", f"{h}/.config/leviath/config.toml"])
    bed.run(f"""
        set -e
        rm -rf /root/sshtest /etc/ssh/leviath-test /srv/sshgit
        mkdir -p /root/sshtest /etc/ssh/leviath-test /run/sshd /srv/sshgit
        ssh-keygen -q -t ed25519 -N '' -f /root/sshtest/host_a
        ssh-keygen -q -t ed25519 -N '' -f /root/sshtest/host_b
        cp {h}/.ssh/lev_test.pub /etc/ssh/leviath-test/authorized_keys
        chmod 644 /etc/ssh/leviath-test/authorized_keys
        {{ printf '[127.0.0.1]:2222 '; cat /root/sshtest/host_a.pub
           printf '[127.0.0.1]:2223 '; cat /root/sshtest/host_b.pub; }} > /etc/ssh/ssh_known_hosts
        git init -q --bare -b main /srv/sshgit/repo.git
        git init -q -b main /root/sshseed && cd /root/sshseed && echo over-ssh > README
        git add README && git -c user.name=t -c user.email=t@t commit -q -m first
        git push -q /srv/sshgit/repo.git main && rm -rf /root/sshseed
        chown -R alice: /srv/sshgit
    """)
    bed.write_file("/etc/ssh/leviath-test/a", sshd_config(2222, "host_a"))
    bed.write_file("/etc/ssh/leviath-test/b", sshd_config(2223, "host_b"))
    servers = [subprocess.Popen(bed.command(["/usr/sbin/sshd", "-D", "-e", "-f",
                                             f"/etc/ssh/leviath-test/{x}"]),
                                stderr=subprocess.DEVNULL) for x in ("a", "b")]
    bed.write_file("/etc/leviath/config.toml", MACHINE)
    bed.run(["systemctl", "restart", "leviathd"])
    yield bed
    for server in servers:
        server.kill()
        server.wait()
    if old.returncode == 0:
        bed.write_file("/etc/leviath/config.toml", old.stdout)
    else:
        bed.run(["rm", "-f", "/etc/leviath/config.toml"])
    bed.run(["rm", "-rf", "/root/sshtest", "/etc/ssh/leviath-test", "/srv/sshgit",
             "/etc/ssh/ssh_known_hosts", f"{h}/.config/leviath/config.toml",
             f"{h}/.ssh/lev_test", f"{h}/.ssh/lev_test.pub"])
    bed.run(["systemctl", "restart", "leviathd"])


@pytest.fixture(scope="module")
def agent(bed: Testbed) -> Iterator[Agent]:
    h = bed.users["alice"].home
    out = bed.run(["lev", "run", "--detach", f"{h}/sshbp"], user="alice",
                  cwd=f"{h}/sshw").stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", out), out
    yield Agent(bed, out, f"{h}/sshw")
    bed.run(["lev", "stop", out], user="alice", check=False)


SSH = "ssh -o BatchMode=yes -o ConnectTimeout=10"


def test_the_agent_logs_in_over_ssh_with_no_key_in_its_sandbox(bed: Testbed, agent: Agent) -> None:
    rc, out, err = agent.call(f"echo $SSH_AUTH_SOCK; {SSH} -p 2222 alice@127.0.0.1 "
                              "echo hello-from-sshd")
    assert rc == 0, err
    assert out.splitlines() == ["/run/leviath/ssh-agent.sock", "hello-from-sshd"]
    records = ssh_records(bed, agent.id)
    signed = [r for r in records if r["LEVIATH_OUTCOME"] == "allow"]
    assert signed and signed[-1]["LEVIATH_TARGET"] == "[127.0.0.1]:2222", records
    assert "alice" in signed[-1]["LEVIATH_DETAIL"]


def test_git_clones_and_pushes_over_ssh(bed: Testbed, agent: Agent) -> None:
    rc, out, err = agent.call(
        "GIT_SSH_COMMAND='ssh -o BatchMode=yes' git clone -q "
        "ssh://alice@127.0.0.1:2222/srv/sshgit/repo.git viassh && cat viassh/README && "
        "cd viassh && echo more >> README && git -c user.name=a -c user.email=a@a commit -q "
        "-am pushed-over-ssh && GIT_SSH_COMMAND='ssh -o BatchMode=yes' git push -q origin main")
    assert rc == 0, err
    assert "over-ssh" in out
    assert "pushed-over-ssh" in bed.run(["git", "--git-dir", "/srv/sshgit/repo.git", "log",
                                         "--oneline"]).stdout


def test_a_host_no_credential_covers_gets_no_signature(bed: Testbed, agent: Agent) -> None:
    rc, _, err = agent.call(f"{SSH} -p 2223 alice@127.0.0.1 echo should-not-run")
    assert rc != 0
    assert "Permission denied" in err
    refused = [r for r in ssh_records(bed, agent.id) if r["LEVIATH_OUTCOME"] == "deny"]
    assert any("not one of a covered host" in r["LEVIATH_DETAIL"] for r in refused), refused


def test_no_bind_or_a_forged_bind_gets_no_signature(bed: Testbed, agent: Agent) -> None:
    agent.bed.run(["sh", "-c", "cat > raw.py"], user="alice", cwd=agent.workdir, input=RAW)
    rc, out, err = agent.call("python3 raw.py")
    assert rc == 0, err
    got = json.loads(out)
    assert got == {"keys": 1, "sign_unbound": 5, "forged_bind": 5, "sign_after": 5,
                   "add_key": 5}, got
    refused = [r for r in ssh_records(bed, agent.id) if r["LEVIATH_OUTCOME"] == "deny"]
    assert any("no session-bind" in r["LEVIATH_DETAIL"] for r in refused), refused


def test_the_key_is_out_of_the_agents_reach(bed: Testbed, agent: Agent) -> None:
    h = bed.users["alice"].home
    _, out, _ = agent.call(
        f"cat {h}/.ssh/lev_test 2>&1 | head -c 300; echo; ls /run/leviath; "
        # (The pattern is split so that this script does not match itself.)
        "grep -l -a 'OPENSSH PRIV''ATE' /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null; "
        "grep -l '^Uid:[[:space:]]0' /proc/[0-9]*/status 2>/dev/null | wc -l; "
        "grep -r -l -a 'OPENSSH PRIV''ATE' $HOME . /tmp 2>/dev/null | wc -l")
    assert "PRIVATE KEY" not in out, out  # hidden: ~/.ssh is not in the sandbox
    assert "ssh-agent.sock" in out
    assert out.splitlines()[-2:] == ["0", "0"], out  # no root process to trace; no copy


def test_the_ssh_agent_comes_back_after_a_daemon_restart(bed: Testbed, agent: Agent) -> None:
    bed.run(["systemctl", "restart", "leviathd"])
    rc, out, err = agent.call(f"{SSH} -p 2222 alice@127.0.0.1 echo after-restart")
    assert rc == 0, err
    assert "after-restart" in out
