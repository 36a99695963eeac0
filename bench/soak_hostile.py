"""Soak with a hostile neighbour (issue 32 §5): three well-behaved users and
one flooding every surface, for MINUTES minutes in the test bed; zero failed
calls for the three, the daemon's RSS and descriptors flat, nothing left
behind. Opt-in, as root (it boots the test bed, never the host's systemd):

    sudo /opt/leviath-dev/venv/bin/python bench/soak_hostile.py --minutes 30

bob, dave and erin each loop, at once:
  - short agents (`lev run -- sh -c 'echo soak; exit 3'`: starts and stops);
  - a detached agent (namespace, proxied, engine socket on) that calls a
    tool (`lev tool read_file`), downloads 1 MiB through its proxy from a
    server on a bed address, and every fourth round runs a container on
    its engine socket (`docker run --rm`; raw `GET /containers/json` when
    the docker CLI is not installed), and makes a credential call (`gh api
    user` through the daemon's wrapper of a `kind = "cli"` credential: the
    broker runs the real `gh`, here a stand-in that only says whether the
    token came, in the credential fence with the token); it is stopped and
    a new one started every 10 rounds.
alice's agent runs bench/neighbour_bench.py's flood on every surface
(engine socket, broker, descriptors on proxy.sock, unresolvable names) and,
on the host, bus clients looping calls; her agent is stopped and started
again every 2 minutes (what she held must be released each time).

Prints one sample line per interval and a summary; exits 1 if a
well-behaved call failed, the daemon restarted, lost an agent's end (its
recheck took it) or anything was left behind.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integration"), str(REPO / "bench"),
                str(REPO)]

from loop_agent import LOOP, LoopAgent  # noqa: E402
from neighbour_bench import BUS, FLOOD  # noqa: E402
from test_engine_socket import BUILD_IMAGE, IMAGE  # noqa: E402
from testbed import CommandFailed, Testbed  # noqa: E402

DOCKER_DIR = os.environ.get("LEVIATH_DOCKER_DIR", "/opt/leviath-dev/docker")
CONFIG = """[sandbox]
kind = "namespace"
network = "proxy"
[sandbox.containers]
enabled = true
# The image is built in root's store (test_engine_socket.BUILD_IMAGE); the
# agents' default engine, their users' own rootless podman, has none.
host_root_engine = true
[taint]
allow_private_addresses = true
[proxy]
ports = [80, 443]
[records]
keep_days = 30
max_per_user = 500
[credentials.gh]
kind = "cli"
command = ["gh"]
token_env = "GH_TOKEN"
secret_file = "/etc/leviath/gh.token"
"""
# A stand-in for GitHub's gh (there is no GitHub here): says whether a token
# came, as a hash, never the token.
TOKEN = "ghp_soak_stand1n_0042"
FAKE_GH = """#!/bin/sh
echo "args: $*"
[ -n "$GH_TOKEN" ] && echo "token: $(printf %s "$GH_TOKEN" | sha256sum | cut -c1-16)"
exit 0
"""
TOKEN_HASH = hashlib.sha256(TOKEN.encode()).hexdigest()[:16]
BLUEPRINT = """
[agent]
name = "soak"
description = "runs the soak's commands"
command = ["sh", "loop.sh"]
"""
GOOD = ("bob", "dave", "erin")
BLOB = 1 << 20
BED_RUN = "--runtime runc --network none --ulimit nofile=1024:1024 --ulimit nproc=1000:1000"
RAW_PS = ("python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); "
          "s.connect('/run/leviath/engine.sock'); s.sendall(b'GET /containers/json HTTP/1.1"
          "\\\\r\\\\nHost: d\\\\r\\\\nConnection: close\\\\r\\\\n\\\\r\\\\n'); "
          "print(s.recv(12).decode())\"")


def sample(bed: Testbed) -> tuple[int, int, int]:
    pid = bed.run(["systemctl", "show", "-P", "MainPID", "leviathd"]).stdout.strip()
    status = bed.run(["cat", f"/proc/{pid}/status"]).stdout
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
    fds = len(bed.run(["ls", f"/proc/{pid}/fd"]).stdout.split())
    return int(pid), rss, fds


def slope(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 2 or len(set(xs)) < 2:
        return 0.0
    return statistics.linear_regression(xs, ys).slope


END_WAIT = 120.0


def left(bed: Testbed) -> tuple[str, str, str]:
    """Scopes, runtime folders and engine-socket containers of agents."""
    scopes = bed.run("systemctl list-units --all --no-legend 'leviath-*.scope' | wc -l"
                     ).stdout.strip()
    runtime = " ".join(bed.run("ls /run/leviath/agents 2>/dev/null", check=False
                               ).stdout.split()) or "none"
    containers = bed.run("podman ps -aq --filter label=org.leviath.engine-agent | wc -l",
                         check=False).stdout.strip()
    return scopes, runtime, containers


def stuck_state(bed: Testbed, user: str, agent_id: str) -> str:
    """What a stuck call left, printed beside its failure: the agent's
    processes, the daemon's records of it and the engine's containers of it."""
    unit = f"leviath-{user}-*{agent_id}*.scope"
    cmds = [f"systemctl status --no-pager -n0 '{unit}' | sed -n '/CGroup/,$p' | head -40",
            f"journalctl -u leviathd --no-pager -o cat --since -5min | grep -F {agent_id} | "
            "tail -30",
            "podman ps -a --filter label=org.leviath.engine-agent=" + agent_id
            + " --format '{{.ID}} {{.Status}} {{.Command}}'",
            "ss -xp | grep -F engine | head -20"]
    out = []
    for c in cmds:
        r = bed.run(c, check=False, timeout=60)
        out.append(f"$ {c}\n{r.stdout}{r.stderr}")
    return "\n".join(out)


def attached_state(bed: Testbed, user: str) -> str:
    """What an attached run with no answer left (a soak once had erin's
    `lev run -- sh -c 'echo soak; exit 3'` unanswered for 180 s, its agent
    `running` with 2 tasks minutes later and no record after its start):
    the user's running agents, and for each its scope, the state and kernel
    wait of its processes and the daemon's records of it."""
    rows = bed.run(f"lev ps --all | awk '$2 == \"{user}\" && $4 == \"running\"'",
                   check=False).stdout
    out = [rows]
    for line in rows.splitlines()[:4]:
        agent_id = line.split()[0]
        out.append(stuck_state(bed, user, agent_id))
        out.append(bed.run(
            f"for p in $(cat /sys/fs/cgroup/*/leviath.slice/*{agent_id}*.scope/cgroup.procs "
            "2>/dev/null | sort -u); do echo \"$p $(cat /proc/$p/wchan) "
            "$(tr '\\0' ' ' < /proc/$p/cmdline) $(grep State /proc/$p/status)\"; done",
            check=False).stdout)
    return "\n".join(out)


def start_agent(bed: Testbed, user: str) -> LoopAgent:
    h = bed.users[user].home
    out = bed.run(["lev", "run", "--detach", f"{h}/sbp"], user=user, cwd=f"{h}/sw",
                  timeout=120).stdout.strip()
    return LoopAgent(bed, out, f"{h}/sw", user=user, timeout=180)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=30.0)
    a = ap.parse_args()
    bed = Testbed()
    try:
        bed.start()
        bed.wait_running()
        bed.install_project(REPO)
        bed.add_standard_users()
        bed.add_user("erin", groups=("leviath",))
        r = bed.run(BUILD_IMAGE, check=False, timeout=300)
        if r.returncode != 0:
            print(f"no image: {r.stderr.strip()}", file=sys.stderr)
            return 2
        docker = os.access(f"{DOCKER_DIR}/bin/docker", os.X_OK)
        if docker:
            bed.run(["install", "-D", "-m", "0755", f"{DOCKER_DIR}/bin/docker",
                     "/usr/bin/docker"])
        # A private address on the bed's lo (no dummy interfaces here): what the
        # proxy allows with allow_private_addresses, unlike 127.0.0.0/8.
        bed.run("ip addr add 10.77.0.2/32 dev lo && echo '10.77.0.2 files.test' >> /etc/hosts && "
                f"mkdir -p /srv/www && head -c {BLOB} /dev/urandom > /srv/www/blob && "
                "(setsid python3 -m http.server --bind 10.77.0.2 --directory /srv/www 80 "
                ">/dev/null 2>&1 &)")
        bed.write_file("/usr/local/bin/gh", FAKE_GH, mode=0o755)
        bed.write_file("/etc/leviath/gh.token", TOKEN + "\n", mode=0o600)
        bed.write_file("/etc/leviath/config.toml", CONFIG)
        bed.start_service("leviathd.service")
        for user in ("alice", *GOOD):
            h = bed.users[user].home
            bed.run(f"mkdir -p {h}/sbp {h}/sw/.req {h}/work && cat > {h}/sbp/blueprint.toml",
                    user=user, input=BLUEPRINT)
            bed.run(["sh", "-c", "cat > loop.sh"], user=user, cwd=f"{h}/sw", input=LOOP)
        bed.write_file(f"{bed.users['alice'].home}/sw/flood.py", FLOOD)
        bed.write_file("/tmp/busflood.py", BUS)
        first_pid, rss0, fds0 = sample(bed)
        calls = {u: 0 for u in GOOD}
        # Seconds each answered call took, by user and kind: a user served
        # late but within the timeouts shows here, not among the failures.
        took: dict[tuple[str, str], list[float]] = defaultdict(list)
        failures: list[str] = []
        hostile_rounds = [0]
        stop = time.monotonic() + a.minutes * 60

        def fail(what: str) -> None:
            failures.append(what[-300:])

        def starts(user: str) -> None:
            cwd = f"{bed.users[user].home}/work"
            while time.monotonic() < stop:
                calls[user] += 1
                t = time.monotonic()
                try:
                    r = bed.run(["lev", "run", "--", "sh", "-c", "echo soak; exit 3"],
                                user=user, cwd=cwd, check=False, timeout=180)
                    took[(user, "run")].append(time.monotonic() - t)
                except subprocess.TimeoutExpired:
                    fail(f"{user} run: no answer within 180 s")
                    print(attached_state(bed, user), flush=True)
                    continue
                if r.returncode != 3:
                    fail(f"{user} run: {r.returncode} {r.stderr.strip()}")

        def started(user: str) -> LoopAgent | None:
            """A new detached agent of the user's; a start that fails is a
            failed call (it once ended the thread, uncounted: 'internal error
            in leviathd'), with the daemon's errors printed, and is tried
            again."""
            while time.monotonic() < stop:
                calls[user] += 1
                t = time.monotonic()
                try:
                    agent = start_agent(bed, user)
                    took[(user, "start")].append(time.monotonic() - t)
                    return agent
                except (CommandFailed, subprocess.TimeoutExpired) as exc:
                    fail(f"{user} start: {' '.join(str(exc).split())[:400]}")
                    print(bed.run("journalctl -u leviathd -p err --no-pager -o cat | tail -40",
                                  check=False).stdout, flush=True)
                    time.sleep(5)
            return None

        def worker(user: str) -> None:
            agent = started(user)
            if agent is None:
                return
            n = 0
            try:
                while time.monotonic() < stop:
                    n += 1
                    steps = [("tool", "lev tool read_file loop.sh", "hostname"),
                             ("download", "curl -sS --max-time 60 -o /dev/null -w "
                              "'%{http_code} %{size_download}' -x http://127.0.0.1:3128 "
                              "http://files.test/blob", f"200 {BLOB}"),
                             ("credential", "gh api user", f"token: {TOKEN_HASH}")]
                    if n % 4 == 0:
                        steps.append(("container", (
                            f"DOCKER_HOST=unix:///run/leviath/engine.sock docker run --rm "
                            f"{BED_RUN} {IMAGE} echo ok") if docker else RAW_PS,
                            "ok" if docker else "HTTP/1.1 200"))
                    stuck = False
                    for what, cmd, want in steps:
                        calls[user] += 1
                        t = time.monotonic()
                        try:
                            rc, out, err = agent.call(cmd)
                            took[(user, what)].append(time.monotonic() - t)
                        except subprocess.TimeoutExpired:
                            # A failed call too (it once ended the thread,
                            # uncounted): noted, and a new agent goes on.
                            fail(f"{user} {what}: no answer within {agent.timeout:g} s "
                                 f"(agent {agent.id}, call {cmd[:80]!r})")
                            print(stuck_state(bed, user, agent.id), flush=True)
                            stuck = True
                            break
                        if rc != 0 or want not in out:
                            fail(f"{user} {what}: rc={rc} {out.strip()[:100]} {err.strip()}")
                    if stuck or n % 10 == 0:
                        bed.run(["lev", "stop", agent.id], user=user, check=False)
                        calls[user] += 1
                        again = started(user)
                        if again is None:
                            return
                        agent = again
            finally:
                bed.run(["lev", "stop", agent.id], user=user, check=False)

        def hostile() -> None:
            w = f"{bed.users['alice'].home}/sw"
            while time.monotonic() < stop:
                try:
                    agent = start_agent(bed, "alice")
                except (CommandFailed, subprocess.TimeoutExpired) as exc:
                    print(f"alice's start failed: {exc}", flush=True)
                    time.sleep(5)
                    continue
                bed.run(f"rm -f {w}/stop-flood {w}/flooding /tmp/stop-bus")
                agent.submit("python3 flood.py engine broker fds names > flood.log 2>&1")
                bed.run("setsid /opt/leviath-dev/venv/bin/python /tmp/busflood.py "
                        "/tmp/stop-bus Get >/dev/null 2>&1 &", user="alice")
                end = min(stop, time.monotonic() + 120)
                while time.monotonic() < end:
                    time.sleep(1)
                bed.run(["touch", f"{w}/stop-flood", "/tmp/stop-bus"])
                bed.run(["lev", "stop", agent.id], user="alice", check=False)
                hostile_rounds[0] += 1

        threads = ([threading.Thread(target=starts, args=(u,)) for u in GOOD]
                   + [threading.Thread(target=worker, args=(u,)) for u in GOOD]
                   + [threading.Thread(target=hostile)])
        for t in threads:
            t.start()
        xs: list[float] = []
        rss: list[float] = []
        fds: list[float] = []
        t0 = time.monotonic()
        while time.monotonic() < stop:
            time.sleep(max(0.0, min(a.interval, stop - time.monotonic())))
            pid, r_kb, n_fd = sample(bed)
            xs.append((time.monotonic() - t0) / 60)
            rss.append(r_kb)
            fds.append(n_fd)
            print(f"{time.monotonic() - t0:7.0f}s pid={pid} rss={r_kb} KiB fds={n_fd} "
                  f"calls={sum(calls.values())} failures={len(failures)} "
                  f"hostile rounds={hostile_rounds[0]}", flush=True)
        for t in threads:
            t.join()
        # The last stops were asked for, not waited on: an agent's end (its
        # engine's containers removed, its scope emptied) takes a while under
        # load. Left behind is what is still there after END_WAIT.
        t_end = time.monotonic()
        while True:
            scopes, runtime, containers = left(bed)
            if ((scopes == "0" and runtime == "none" and containers == "0")
                    or time.monotonic() - t_end > END_WAIT):
                break
            time.sleep(2)
        ended_in = time.monotonic() - t_end
        last_pid, rss1, fds1 = sample(bed)
        if runtime != "none":
            for agent_id in runtime.split()[:3]:
                print(bed.run("lev ps --all; journalctl -u leviathd --no-pager -o cat | "
                              f"grep -F {agent_id} | tail -15", check=False).stdout)
        print()
        print(f"{a.minutes:g} min; well-behaved calls: "
              + ", ".join(f"{u} {n}" for u, n in calls.items())
              + f"; failed: {len(failures)}; alice's flooding agents: {hostile_rounds[0]}")
        print(f"daemon RSS: {rss0} KiB at the start, {rss1} KiB at the end, max "
              f"{max(rss, default=0)} KiB, slope {slope(xs, rss):+.0f} KiB/min")
        print(f"daemon fds: {fds0} at the start, {fds1} at the end, max {max(fds, default=0)}, "
              f"slope {slope(xs, fds):+.1f}/min")
        print(f"everything of the last agents gone {ended_in:.0f} s after the end")
        print(f"left behind: scopes={scopes} runtime folders: {runtime} containers={containers}; "
              f"daemon restarted: {'yes' if last_pid != first_pid else 'no'}")
        for (user, what), secs in sorted(took.items()):
            print(f"  {user:5} {what:10} {len(secs):5} calls, median "
                  f"{statistics.median(secs):5.1f} s, max {max(secs):6.1f} s, "
                  f"over 30 s: {sum(x > 30 for x in secs)}")
        for f in failures[:10]:
            print("  failure:", f)
        # An end the loop lost and the 5 s recheck took (docs/operations.md):
        # no caller saw it fail, but it is a bug of the daemon's.
        lost = bed.run("journalctl -u leviathd --no-pager -o cat | grep -cE "
                       "'not heard from the event loop|still registered with the event loop'",
                       check=False).stdout.strip() or "0"
        print(f"ends the event loop lost (taken by the recheck): {lost}")
        bad = (failures or last_pid != first_pid or scopes != "0" or runtime != "none"
               or containers != "0" or lost != "0")
        return 1 if bad else 0
    finally:
        bed.stop()


if __name__ == "__main__":
    sys.exit(main())
