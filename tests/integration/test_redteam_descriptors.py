"""Red team (issue 32): no agent or user can make the daemon hold descriptors
past her share, and what she made it hold goes when her agent ends.

From inside alice's agent (a namespace sandbox with the proxy), on every
socket of her runtime folder (/run/leviath: broker.sock, proxy.sock,
engine.sock; the containers are on): connections, each carrying descriptors that are not
sockets (SCM_RIGHTS, /dev/null, several a message), kept open until the
daemon closes them; then connections that send nothing, kept open. As
alice on the host: bus calls carrying 16 descriptors each. Meanwhile the
daemon's open files (/proc/PID/fd, read by root in the bed) must stay
within alice's share (fdshare.user_share of the daemon's soft limit), bob's
agent must run, call a tool and be answered by its proxy, and after alice's
agent ends the daemon's open files come back to where they were.

Before the fix an agent's descriptors sent over proxy.sock stayed in the
daemon for good (socket.socket(fileno=) of a non-socket raised, and the
number was never closed): 16,359 in 3.2 s filled its LimitNOFILE."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from loop_agent import LOOP, LoopAgent
from quiescent import settled
from testbed import Testbed

from leviathd import fdshare

pytestmark = pytest.mark.testbed

BLUEPRINT = """
[agent]
name = "rtfds"
description = "runs the test's commands"
command = ["sh", "loop.sh"]
"""

CONFIG = """
[sandbox]
kind = "namespace"
network = "proxy"

[sandbox.containers]
enabled = true

[proxy]
deny_domains = ["denied.test"]
ports = [80, 443]
"""

# Per socket: more connections than alice's whole share at the unit's limit.
PER_SOCKET = 2500
FLOOD = r"""
import os, resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
room = min(hard, 65536) - 64  # this process's own limit, with room to report
null = os.open("/dev/null", os.O_RDONLY)
held, report = [], []

def connect(path):
    # A full backlog (EAGAIN) waits for the daemon to accept; 3 s without
    # an accept is a refusal.
    deadline = time.monotonic() + 3
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
            return s
        except BlockingIOError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)
        except OSError:
            s.close()
            raise

def prune():
    # Connections the daemon closed (refused) free this process's room.
    keep = []
    for s in held:
        try:
            while s.recv(65536, socket.MSG_DONTWAIT):
                pass  # a refusal's text, then (for a refused one) the end
            s.close()
            continue
        except BlockingIOError:
            keep.append(s)  # still open on the daemon's side
        except OSError:
            s.close()
    held[:] = keep

for name in sorted(os.listdir("/run/leviath")):
    path = "/run/leviath/" + name
    if not name.endswith(".sock"):
        continue
    sent = 0
    why1 = why2 = "-"
    for i in range(PER_SOCKET):
        if len(held) >= room:
            prune()
            if len(held) >= room:
                break
        try:
            s = connect(path)
        except OSError as exc:
            why1 = repr(exc)
            break
        try:
            socket.send_fds(s, [b"\0"], [null] * 8)
        except OSError:  # the daemon refused this one already
            s.close()
            continue
        held.append(s)
        sent += 8
    silent = 0
    for i in range(PER_SOCKET):
        if len(held) >= room:
            prune()
            if len(held) >= room:
                break
        try:
            s = connect(path)
        except OSError as exc:
            why2 = repr(exc)
            break
        held.append(s)
        silent += 1
    report.append(f"{name} {sent} {silent} {why1} {why2}")
open("flooded.tmp", "w").write("\n".join(report) + "\n")
os.rename("flooded.tmp", "flooded")
while not os.path.exists("release"):
    time.sleep(0.2)
""".replace("PER_SOCKET", str(PER_SOCKET))

START_FLOOD = """rm -f flooded release && cat > flood.py <<'EOF'
FLOOD
EOF
nohup python3 flood.py >flood.log 2>&1 &
pid=$!
until [ -s flooded ]; do
  kill -0 $pid 2>/dev/null || { echo "the flood died:" >&2; cat flood.log >&2; exit 1; }
  sleep 0.2
done
cat flooded""".replace("FLOOD", FLOOD)

# As alice on the host: bus calls, each with 16 descriptors the daemon does
# not take (an unknown method, a known one, a signal).
BUS_FLOOD = r"""
import asyncio, os
from dbus_fast import Message, MessageType, BusType
from dbus_fast.aio import MessageBus

async def main():
    bus = await MessageBus(bus_type=BusType.SYSTEM, negotiate_unix_fd=True).connect()
    null = os.open("/dev/null", os.O_RDONLY)
    for i in range(400):
        member = ("Frobnicate", "List")[i % 2]
        await bus.call(Message(destination="org.leviath.Manager1",
                               path="/org/leviath/Manager1",
                               interface="org.leviath.Manager1", member=member,
                               signature="h", body=[0], unix_fds=[null] * 16))
    print("sent", 400 * 16)
    bus.disconnect()

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    for user in ("alice", "bob"):
        h = bed.users[user].home
        bed.run(f"mkdir -p {h}/rtfdbp {h}/rtfdw/.req && cat > {h}/rtfdbp/blueprint.toml",
                user=user, input=BLUEPRINT)
        bed.run(["sh", "-c", "cat > loop.sh"], user=user, cwd=f"{h}/rtfdw", input=LOOP)
    old = bed.run(["cat", "/etc/leviath/config.toml"], check=False).stdout
    bed.write_file("/etc/leviath/config.toml", CONFIG)
    bed.run(["systemctl", "restart", "leviathd"])
    yield bed
    bed.write_file("/etc/leviath/config.toml", old)
    bed.run(["systemctl", "restart", "leviathd"])


def _start(bed: Testbed, user: str) -> LoopAgent:
    home = bed.users[user].home
    workdir = f"{home}/rtfdw"
    out = bed.run(["lev", "run", "--detach", f"{home}/rtfdbp"], user=user,
                  cwd=workdir).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", out), out
    return LoopAgent(bed, out, workdir, user=user, timeout=120)


def _daemon(bed: Testbed) -> int:
    return int(bed.run(["systemctl", "show", "-P", "MainPID", "leviathd"]).stdout)


# Each count is taken at a quiescent point the test waits for (quiescent.py):
# never on the way, while the daemon accepts a connection only to refuse it.
QUIET_WAIT = 120


def _open_files(bed: Testbed, pid: int) -> int:
    return settled(bed, pid, "fds", wait=QUIET_WAIT)


def _soft_limit(bed: Testbed, pid: int) -> int:
    for line in bed.read_file(f"/proc/{pid}/limits").splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no 'Max open files' in the daemon's limits")


def _bob_is_served(bob: LoopAgent) -> None:
    rc, out, err = bob.call("lev tool read_file loop.sh")
    assert rc == 0 and "hostname" in out, (rc, out, err)
    rc, out, err = bob.call(
        "curl -sS --max-time 20 -o /dev/null -w '%{http_code}' "
        "-x http://127.0.0.1:3128 http://denied.test/")
    assert out.strip() == "403", (out, err)  # the proxy answered him by policy
    rc, out, err = bob.call(": > /dev/null && echo ran")
    assert rc == 0 and out.strip() == "ran", (rc, out, err)


DROPIN = "/run/systemd/system/leviathd.service.d/nofile.conf"


@pytest.fixture(params=[None, 1024], ids=["unit-limit", "nofile-1024"])
def limit(bed: Testbed, request: pytest.FixtureRequest) -> Iterator[None]:
    """The unit's LimitNOFILE, and systemd's default 1,024 (alice's share 96:
    below what one agent's per-socket caps alone allow, so the share itself
    is what holds her)."""
    if request.param is None:
        yield
        return
    bed.run(f"mkdir -p {DROPIN.rsplit('/', 1)[0]} && printf '[Service]\\nLimitNOFILE="
            f"{request.param}\\n' > {DROPIN} && systemctl daemon-reload && "
            "systemctl restart leviathd")
    try:
        yield
    finally:
        bed.run(f"rm -f {DROPIN} && systemctl daemon-reload && systemctl restart leviathd")


def test_descriptors_sent_on_every_socket_stay_within_the_senders_share_and_go_with_her(
    bed: Testbed, limit: None,
) -> None:
    pid = _daemon(bed)
    share = fdshare.user_share(_soft_limit(bed, pid))
    alice = _start(bed, "alice")
    bob = _start(bed, "bob")
    try:
        _bob_is_served(bob)  # every path bob takes below is open once before counting
        before = _open_files(bed, pid)
        rc, out, err = alice.call(START_FLOOD, timeout=300)
        assert rc == 0, err
        sockets = dict(line.split(" ", 1) for line in out.strip().splitlines())
        # The attack really reached the sockets it was meant for.
        assert {"broker.sock", "proxy.sock", "engine.sock"} <= set(sockets), out
        r = bed.run(["/opt/leviath-dev/venv/bin/python", "-c", BUS_FLOOD], user="alice",
                    timeout=120)
        assert "sent 6400" in r.stdout, (r.stdout, r.stderr)
        during = _open_files(bed, pid)
        assert during - before <= share, (
            f"the daemon holds {during - before} more files for alice (share {share}): {out}")
        _bob_is_served(bob)
        bed.run(["lev", "stop", alice.id], user="alice")
        # Each count is a quiescent one; the end's own work (scope stop,
        # exit record, readers ended a second later) may still come after
        # one, so several are taken, bounded.
        deadline = time.monotonic() + QUIET_WAIT
        after = _open_files(bed, pid)
        while after > before and time.monotonic() < deadline:
            after = _open_files(bed, pid)
        assert after <= before, f"{after} open files after alice's agent ended, {before} before"
        assert _daemon(bed) == pid  # the same daemon throughout
    finally:
        for agent in (alice, bob):
            bed.run(["lev", "stop", agent.id], user=agent.user, check=False)
