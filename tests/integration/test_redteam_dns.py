"""Red team (issue 32 §2): one user's unresolvable names must not queue
another user's proxied requests.

The bed has no name server, so the test makes one: a tiny UDP responder on
the bed's loopback (127.0.0.1:53, named in the bed's /etc/resolv.conf, the
way the daemon's getaddrinfo really resolves) that never answers names
under slow.test and answers names under bob.test at once (127.0.0.1, which
the proxy then refuses by its address check: a 403 is bob being served).
alice's agent keeps 48 CONNECTs to fresh slow.test names in flight; bob's
agent asks for three bob.test names meanwhile and must get each answer
within curl's 10 s (the proxy's own connect timeout is 15 s).

Before the fix every lookup ran in the event loop's default executor (6
threads on this machine, shared with `lev ps`'s usage figures): alice's
stuck lookups filled it and bob waited behind them (the issue: 15 s, 502).
Only that bob is served is checked here; bench/dns_bench.py prints the ratio."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import pytest
from loop_agent import LOOP, LoopAgent
from testbed import Testbed

pytestmark = pytest.mark.testbed

BLUEPRINT = """
[agent]
name = "rtdns"
description = "runs the test's commands"
command = ["sh", "loop.sh"]
"""

CONFIG = """
[sandbox]
kind = "namespace"
network = "proxy"

[proxy]
ports = [80, 443]
"""

RESPONDER = r"""
import socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 53))
open("/run/rtdns.pid", "w").write(str(__import__("os").getpid()))
open("/run/rtdns.ready", "w").close()
while True:
    data, peer = s.recvfrom(4096)
    try:
        i, labels = 12, []
        while data[i]:
            labels.append(data[i + 1:i + 1 + data[i]])
            i += 1 + data[i]
        name = b".".join(labels).lower()
        qtype = struct.unpack("!H", data[i + 1:i + 3])[0]
        question = data[12:i + 5]
    except (IndexError, struct.error):
        continue
    if name.endswith(b"slow.test"):
        continue  # never answers
    answers = b""
    rcode = 3  # no such name
    if name.endswith(b"bob.test"):
        rcode = 0
        if qtype == 1:
            answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 5, 4) + bytes([127, 0, 0, 1])
    head = data[:2] + struct.pack("!HHHHH", 0x8180 | rcode, 1, 1 if answers else 0, 0, 0)
    s.sendto(head + question + answers, peer)
"""

FLOOD = r"""
import os, random, socket, threading, time
def one():
    while not os.path.exists("stop-flood"):
        try:
            s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
            name = "%016x.slow.test" % random.getrandbits(64)
            s.sendall(("CONNECT %s:443 HTTP/1.1\r\nHost: %s\r\n\r\n" % (name, name)).encode())
            s.recv(100)
            s.close()
        except OSError:
            time.sleep(0.1)
for _ in range(48):
    threading.Thread(target=one, daemon=True).start()
time.sleep(3)
open("flooding", "w").close()
while not os.path.exists("stop-flood"):
    time.sleep(0.2)
"""

START_FLOOD = """rm -f flooding stop-flood && cat > flood.py <<'EOF'
FLOOD
EOF
nohup python3 flood.py >flood.log 2>&1 &
until [ -e flooding ]; do sleep 0.2; done; echo flooding""".replace("FLOOD", FLOOD)


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    for user in ("alice", "bob"):
        h = bed.users[user].home
        bed.run(f"mkdir -p {h}/rtdnsbp {h}/rtdnsw/.req && cat > {h}/rtdnsbp/blueprint.toml",
                user=user, input=BLUEPRINT)
        bed.run(["sh", "-c", "cat > loop.sh"], user=user, cwd=f"{h}/rtdnsw", input=LOOP)
    old_config = bed.run(["cat", "/etc/leviath/config.toml"], check=False).stdout
    old_resolv = bed.run(["cat", "/etc/resolv.conf"], check=False).stdout
    bed.write_file("/etc/leviath/config.toml", CONFIG)
    bed.run("rm -f /run/rtdns.ready /etc/resolv.conf && "
            "printf 'nameserver 127.0.0.1\\noptions timeout:2 attempts:2\\n' > /etc/resolv.conf")
    bed.write_file("/root/rtdns.py", RESPONDER)
    responder = subprocess.Popen(bed.command(["python3", "/root/rtdns.py"]),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        bed.run("until [ -e /run/rtdns.ready ]; do sleep 0.05; done", timeout=30)
        bed.run(["systemctl", "restart", "leviathd"])
        yield bed
    finally:
        bed.run("kill $(cat /run/rtdns.pid) || true", check=False)
        responder.kill()
        responder.wait()
        bed.run(["sh", "-c", 'cat > /etc/resolv.conf'], input=old_resolv)
        bed.write_file("/etc/leviath/config.toml", old_config)
        bed.run(["systemctl", "restart", "leviathd"])


def _start(bed: Testbed, user: str) -> LoopAgent:
    home = bed.users[user].home
    workdir = f"{home}/rtdnsw"
    out = bed.run(["lev", "run", "--detach", f"{home}/rtdnsbp"], user=user,
                  cwd=workdir).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", out), out
    return LoopAgent(bed, out, workdir, user=user, timeout=120)


def _bob_asks(bob: LoopAgent, name: str) -> tuple[str, str]:
    _rc, out, err = bob.call(
        "curl -sS --max-time 10 -o /dev/null -w '%{http_code}' "
        f"-x http://127.0.0.1:3128 http://{name}/")
    return out.strip(), err


def test_one_users_unresolvable_names_do_not_queue_another_users_requests(
    bed: Testbed,
) -> None:
    alice = _start(bed, "alice")
    bob = _start(bed, "bob")
    try:
        # The responder and the proxy's address check, before the flood.
        code, err = _bob_asks(bob, "first.bob.test")
        assert code == "403", (code, err)
        rc, out, err = alice.call(START_FLOOD, timeout=60)
        assert rc == 0 and out.strip() == "flooding", (out, err)
        for i in range(3):
            code, err = _bob_asks(bob, f"during{i}.bob.test")
            assert code == "403", (i, code, err)  # served by policy, not 502 or a timeout
        # And the flood really is stuck in the resolver: alice gets no answer of 200.
        rc, out, err = alice.call(
            "curl -sS --max-time 30 -o /dev/null -w '%{http_code}' "
            "-x http://127.0.0.1:3128 http://never.slow.test/")
        assert out.strip() == "502", (out, err)
    finally:
        bed.run(["sh", "-c", f"touch {alice.workdir}/stop-flood"], user="alice", check=False)
        for agent in (alice, bob):
            bed.run(["lev", "stop", agent.id], user=agent.user, check=False)
