"""Red team: one user's agents must not use up the daemon's proxy for every
other user (threats.md: the daemon's own limits).

alice starts several proxied agents; each opens its full share of idle
connections to its forwarder (the daemon holds each until the handshake
timeout). bob's agent then asks its proxy for anything: the daemon must
still answer him by policy, not with 429 "too many connections"."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from test_gate_bed import LOOP, Agent, lev
from testbed import Testbed

pytestmark = pytest.mark.testbed

BLUEPRINT = """
[agent]
name = "rtproxy"
description = "runs the test's commands"
command = ["sh", "loop.sh"]
"""

CONFIG = """
[sandbox]
kind = "namespace"
network = "proxy"

[proxy]
deny_domains = ["denied.test"]
ports = [80, 443]
"""

ALICE_AGENTS = 8  # with the bed's 1,024 descriptors: 8 x 64 fills the old global cap
HOLD = """nohup python3 -c '
import socket, time
s = []
for _ in range(64):
    try:
        s.append(socket.create_connection(("127.0.0.1", 3128), timeout=5))
    except OSError:
        break
open("held", "w").write(str(len(s)))
time.sleep(60)
' >/dev/null 2>&1 &
for i in $(seq 100); do [ -s held ] && break; sleep 0.1; done; cat held"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    for user in ("alice", "bob", "dave"):
        h = bed.users[user].home
        bed.run(f"mkdir -p {h}/rtpbp {h}/rtpw/.req && cat > {h}/rtpbp/blueprint.toml",
                user=user, input=BLUEPRINT)
        bed.run(["sh", "-c", "cat > loop.sh"], user=user, cwd=f"{h}/rtpw", input=LOOP)
    old = bed.run(["cat", "/etc/leviath/config.toml"], check=False).stdout
    bed.write_file("/etc/leviath/config.toml", CONFIG)
    bed.run(["systemctl", "restart", "leviathd"])
    yield bed
    bed.write_file("/etc/leviath/config.toml", old)
    bed.run(["systemctl", "restart", "leviathd"])


def _start(bed: Testbed, user: str) -> Agent:
    home = bed.users[user].home
    workdir = f"{home}/rtpw"
    out = lev(bed, user, "run", "--detach", f"{home}/rtpbp", cwd=workdir).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", out), out
    return Agent(bed, user, out, workdir)


def test_one_users_idle_connections_do_not_shut_another_user_out_of_the_proxy(
    bed: Testbed,
) -> None:
    agents: list[Agent] = []
    try:
        held = 0
        for _ in range(ALICE_AGENTS):
            a = _start(bed, "alice")
            agents.append(a)
            rc, out, err = a.call(HOLD)
            assert rc == 0, err
            held += int(out.strip() or 0)
        assert held >= 64  # the attack really holds connections
        bob = _start(bed, "bob")
        agents.append(bob)
        time.sleep(0.5)
        rc, out, err = bob.call(
            "curl -sS --max-time 10 -o /dev/null -w '%{http_code}' "
            "-x http://127.0.0.1:3128 http://denied.test/")
        assert out.strip() != "429", (out, err)
        assert out.strip() == "403", (out, err)
    finally:
        for a in agents:
            lev(bed, a.user, "stop", a.id, check=False)


DROPIN = "/run/systemd/system/leviathd.service.d/nofile.conf"


def test_two_users_together_cannot_shut_a_third_out_of_the_proxy(bed: Testbed) -> None:
    """With a soft limit of 1,024 (systemd's default, as on a unit without
    LimitNOFILE) the old shares (half the total each) let alice and bob,
    two agents each, fill the whole proxy: dave got 429. Each user's share
    is now an eighth."""
    bed.run(f"mkdir -p {DROPIN.rsplit('/', 1)[0]} && printf '[Service]\\nLimitNOFILE=1024\\n' "
            f"> {DROPIN} && systemctl daemon-reload && systemctl restart leviathd")
    agents: list[Agent] = []
    try:
        for user in ("alice", "bob"):
            held = 0
            for _ in range(2):
                a = _start(bed, user)
                agents.append(a)
                rc, out, err = a.call(HOLD)
                assert rc == 0, err
                held += int(out.strip() or 0)
            assert held >= 64  # the attack really opens connections
        dave = _start(bed, "dave")
        agents.append(dave)
        time.sleep(0.5)
        rc, out, err = dave.call(
            "curl -sS --max-time 10 -o /dev/null -w '%{http_code}' "
            "-x http://127.0.0.1:3128 http://denied.test/")
        assert out.strip() == "403", (out, err)
        # And alice herself is held to her share: her next one is refused.
        rc, out, err = agents[0].call(
            "curl -sS --max-time 10 -o /dev/null -w '%{http_code}' "
            "-x http://127.0.0.1:3128 http://denied.test/")
        assert out.strip() == "429", (out, err)
    finally:
        for a in agents:
            lev(bed, a.user, "stop", a.id, check=False)
        bed.run(f"rm -f {DROPIN} && systemctl daemon-reload && systemctl restart leviathd")
