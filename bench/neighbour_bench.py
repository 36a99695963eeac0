"""bob's `lev ps` while alice's agent does her worst on every surface at once,
against the same `lev ps` idle, in one run (issue 32 §3; the aim: within 2x).

Boots the test bed (needs root), installs the checkout, turns the engine
socket and the proxy on, and starts one agent of alice's (namespace) and one
of bob's. Then, round by round: bob's `lev ps` N times idle; alice's flood
starts (inside her agent, all at once: 8 connections looping 1 MiB JSON
container creates on engine.sock, 8 looping 1 MiB request lines on
broker.sock, connections with descriptors and silent ones on proxy.sock,
CONNECTs to names that do not resolve; as alice on the host, 32 bus
connections looping `Get` calls of 100 KB); bob's `lev ps` N times again;
the flood stops. Each phase also prints the CPU the daemon and the bus
daemon used while bob was timed, and with --py-spy the daemon's profile.

    sudo /opt/leviath-dev/venv/bin/python bench/neighbour_bench.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integration"), str(REPO)]

from loop_agent import LOOP, LoopAgent  # noqa: E402
from test_engine_socket import BUILD_IMAGE  # noqa: E402
from testbed import Testbed  # noqa: E402

CONFIG = """[sandbox]
kind = "namespace"
network = "proxy"
[sandbox.containers]
enabled = true
"""

BLUEPRINT = """
[agent]
name = "neighbour"
description = "runs the bench's commands"
command = ["sh", "loop.sh"]
"""

# bob's timer, as bob in the bed: `lev ps` n times, the times in ms as JSON.
TIMER = r"""
import json, subprocess, sys, time
out = []
for _ in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    subprocess.run(["lev", "ps"], check=True, stdout=subprocess.DEVNULL)
    out.append((time.perf_counter() - t0) * 1e3)
print(json.dumps(out))
"""

FLOOD = r"""
import json, os, random, socket, threading, time
stop = lambda: os.path.exists("stop-flood")
MIB = 1 << 20
big = json.dumps({"Image": "x", "HostConfig": {"Privileged": True},
                  "Env": ["A=" + "a" * 1000] * (MIB // 1010)}).encode()
def engine():
    head = (b"POST /containers/create HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n" % len(big))
    while not stop():
        try:
            s = socket.socket(socket.AF_UNIX); s.connect("/run/leviath/engine.sock")
            s.sendall(head + big)
            while s.recv(65536): pass
            s.close()
        except OSError: time.sleep(0.05)
def broker():
    line = json.dumps({"op": "call", "tool": "read_file",
                       "args": {"path": "x", "pad": ["b" * 1000] * (MIB // 1010)}}).encode()
    while not stop():
        try:
            s = socket.socket(socket.AF_UNIX); s.connect("/run/leviath/broker.sock")
            f = s.makefile("rb")
            for _ in range(20):
                if stop(): break
                s.sendall(line + b"\n"); f.readline()
            s.close()
        except OSError: time.sleep(0.05)
def fds():
    null = os.open("/dev/null", os.O_RDONLY)
    while not stop():
        held = []
        for _ in range(200):
            try:
                s = socket.socket(socket.AF_UNIX); s.connect("/run/leviath/proxy.sock")
                socket.send_fds(s, [b"\0"], [null] * 8); held.append(s)
            except OSError: break
        for s in held: s.close()
def names():
    while not stop():
        try:
            s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
            n = "%016x.nowhere.test" % random.getrandbits(64)
            s.sendall(("CONNECT %s:443 HTTP/1.1\r\n\r\n" % n).encode()); s.recv(100); s.close()
        except OSError: time.sleep(0.05)
def spin():
    # No daemon surface at all: alice's CPU alone, the peer that tells what
    # of bob's slowdown is the machine's two cores rather than the daemon.
    while not stop():
        sum(range(10000))
import sys
for fn, n in ((engine, 8), (broker, 8), (fds, 1), (names, 16), (spin, 8)):
    if fn.__name__ not in sys.argv[1:]:
        continue
    for _ in range(n): threading.Thread(target=fn, daemon=True).start()
open("flooding", "w").close()
while not stop(): time.sleep(0.2)
"""

BUS = r"""
import asyncio, os, sys
from dbus_fast import Message, BusType
from dbus_fast.aio import MessageBus
# One call at a time a connection, the next as soon as the reply comes
# (dbus-fast's client gives up with BlockingIOError when several large
# calls are sent at once on one connection), on 32 connections.
async def one():
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    while not os.path.exists(sys.argv[1]):
        await bus.call(Message(
            destination="org.leviath.Manager1", path="/org/leviath/Manager1",
            interface="org.leviath.Manager1", member=sys.argv[2], signature="s",
            body=["x" * 100000]))
async def main():
    await asyncio.gather(*(one() for _ in range(32)))
asyncio.run(main())
"""


SURFACES = ["engine", "broker", "fds", "names", "bus"]
PHASES = [*SURFACES, "all", "spin"]


def cpu(bed: Testbed) -> dict[str, float]:
    """CPU seconds used so far by the daemon and by the bus daemon (where the
    time of a flood goes: into leviathd's one loop, or into dbus-daemon)."""
    out = {}
    for name, unit in (("leviathd", "leviathd"), ("dbus-daemon", "dbus")):
        pid = bed.run(["systemctl", "show", "-P", "MainPID", unit]).stdout.strip()
        stat = bed.run(["cat", f"/proc/{pid}/stat"], check=False).stdout
        fields = stat.rsplit(")", 1)[-1].split()
        out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0
    return out


def host_pid(bed: Testbed, unit: str) -> int:
    """The host's pid of a bed unit's main process (for a profiler run on the host)."""
    inner = bed.run(["systemctl", "show", "-P", "MainPID", unit]).stdout.strip()
    ns = os.readlink(f"/proc/{bed.pid}/ns/pid")
    for p in Path("/proc").iterdir():
        try:
            if not p.name.isdigit() or os.readlink(p / "ns" / "pid") != ns:
                continue
            nspid = next(line for line in (p / "status").read_text().splitlines()
                         if line.startswith("NSpid:")).split()
        except (OSError, StopIteration):
            continue
        if nspid[-1] == inner:
            return int(p.name)
    raise RuntimeError(f"no host pid for {unit}")


def times(bed: Testbed, n: int) -> list[float]:
    home = bed.users["bob"].home
    out = bed.run(["python3", f"{home}/timer.py", str(n)], user="bob", timeout=600).stdout
    got: list[float] = json.loads(out.strip().splitlines()[-1])
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-round", type=int, default=15, help="`lev ps` calls per phase")
    ap.add_argument("--py-spy", metavar="PROGRAM", help="profile the daemon with py-spy "
                    "for 15 s during each phase's flood (collapsed stacks to /tmp/nb-PHASE.txt)")
    ap.add_argument("--phases", default=",".join(PHASES), help="comma-separated, of: "
                    + ", ".join(PHASES))
    args = ap.parse_args()
    phases = [p for p in args.phases.split(",") if p in PHASES]
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(REPO)
        bed.add_standard_users()
        r = bed.run(BUILD_IMAGE, check=False, timeout=180)
        if r.returncode != 0:
            print(f"no image: {r.stderr.strip()}", file=sys.stderr)
            return 2
        bed.write_file("/etc/leviath/config.toml", CONFIG)
        bed.run(["systemctl", "restart", "leviathd"])
        agents = {}
        for user in ("alice", "bob"):
            h = bed.users[user].home
            bed.run(f"mkdir -p {h}/nbp {h}/nw/.req && cat > {h}/nbp/blueprint.toml",
                    user=user, input=BLUEPRINT)
            bed.run(["sh", "-c", "cat > loop.sh"], user=user, cwd=f"{h}/nw", input=LOOP)
            out = bed.run(["lev", "run", "--detach", f"{h}/nbp"], user=user,
                          cwd=f"{h}/nw").stdout.strip()
            agents[user] = LoopAgent(bed, out, f"{h}/nw", user=user, timeout=120)
        alice = agents["alice"]
        bed.write_file(f"{bed.users['bob'].home}/timer.py", TIMER, mode=0o644)
        bed.write_file(f"{alice.workdir}/flood.py", FLOOD, mode=0o644)
        bed.write_file("/tmp/busflood.py", BUS, mode=0o644)
        stopfile = "/tmp/stop-bus"
        idle: list[float] = []
        busy: dict[str, list[float]] = {k: [] for k in phases}
        # CPU seconds a second of the busy part of each phase, by process.
        load: dict[str, list[dict[str, float]]] = {k: [] for k in phases}
        for _ in range(args.rounds):
            for phase in phases:
                idle += times(bed, args.per_round)
                surfaces = SURFACES if phase == "all" else [phase]
                inside = [x for x in surfaces if x != "bus"]
                bed.run(f"rm -f {alice.workdir}/stop-flood {alice.workdir}/flooding {stopfile}")
                n = None
                if inside:
                    n = alice.submit(f"python3 flood.py {' '.join(inside)} > flood.log 2>&1")
                    r = bed.run(f"for i in $(seq 600); do [ -e {alice.workdir}/flooding ] && "
                                "exit 0; sleep 0.1; done; exit 1", check=False, timeout=90)
                    if r.returncode != 0:
                        print(f"{phase}: the flood did not start:",
                              bed.run(f"cat {alice.workdir}/flood.log {alice.dir}/*.err; "
                                      f"lev ps --all; lev logs {alice.id} | tail -20",
                                      check=False, user="alice").stdout,
                              file=sys.stderr)
                        return 1
                if "bus" in surfaces:
                    bed.run(f"setsid /opt/leviath-dev/venv/bin/python /tmp/busflood.py "
                            f"{stopfile} Get >/dev/null 2>/tmp/busflood.err &", user="alice")
                if args.py_spy:
                    subprocess.run([args.py_spy, "record", "-d", "15", "-r", "200", "-p",
                                    str(host_pid(bed, "leviathd")), "-f", "raw", "-o",
                                    f"/tmp/nb-{phase}.txt"], check=False)
                c0, t0 = cpu(bed), time.monotonic()
                busy[phase] += times(bed, args.per_round)
                c1, dt = cpu(bed), time.monotonic() - t0
                load[phase].append({k: (c1[k] - c0[k]) / dt for k in c0})
                bed.run(["touch", f"{alice.workdir}/stop-flood", stopfile])
                if n is not None:
                    alice.result(n, timeout=120)
        bus_err = bed.run("tail -3 /tmp/busflood.err", check=False).stdout.strip()
        if bus_err:
            print(f"the bus flood said: {bus_err}", file=sys.stderr)
        for a in agents.values():
            bed.run(["lev", "stop", a.id], user=a.user, check=False)
    mi = statistics.median(idle)
    print(f"bob's `lev ps`, {args.per_round} calls a phase, {args.rounds} rounds interleaved; "
          f"idle {mi:.1f} ms (median of {len(idle)})")
    for phase in phases:
        mb = statistics.median(busy[phase])
        aim = "  (aim <= 2.00)" if phase == "all" else ""
        use = "  ".join(f"{k} {statistics.mean(d[k] for d in load[phase]):.2f} cpu"
                        for k in load[phase][0])
        print(f"  alice flooding {phase:7} {mb:8.1f} ms   ratio {mb / mi:.2f}{aim}   ({use})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
