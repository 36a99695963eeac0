"""Runs as root inside the test bed (see bench/table.py, bench/scale.py):
measurements that need the bed's /proc and cgroups.

    probe.py mem UNIT...        PSS and tasks of each agent's own processes
                                (all but the agent's command), and leviathd's PSS
    probe.py daemon             leviathd's main PID: private memory, RSS, fds
    probe.py peer N WINDOW      N `systemd-run --scope sleep 600` (root, the
                                agents' limits, in peer.slice), WINDOW
                                starting at a time; wall time to all
                                running, then the slice stopped
    probe.py starts N CMD USER...  N concurrent `lev run --detach -- CMD` (split
                                over USERs, each in ~USER/work); wall time to
                                all returned, failures (first lines of stderr)
    probe.py list USER ROUNDS   `lev ps` and a bare `busctl call ... List` as USER
    probe.py stopall USER...    stop every agent of USERs at once; wall time
"""

from __future__ import annotations

import json
import os
import pwd
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CGROOT = Path("/sys/fs/cgroup")


def rollup(pid: int) -> dict[str, int]:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines()[1:]:
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            out[key] = int(rest.split()[0])
    return out


def pss_kib(pid: int) -> int:
    return rollup(pid).get("Pss", 0)


def private_kib(pid: int) -> int:
    r = rollup(pid)
    return r.get("Private_Clean", 0) + r.get("Private_Dirty", 0)


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def unit_pids(unit: str) -> list[int]:
    cg = subprocess.run(
        ["systemctl", "show", "-P", "ControlGroup", unit], capture_output=True, text=True
    ).stdout.strip()
    if not cg:
        return []
    pids: list[int] = []
    # cgroup v2, or the named systemd hierarchy of a hybrid (v1) host.
    bases = [CGROOT / sub / cg.lstrip("/") for sub in ("", "unified", "systemd")]
    base = next((b for b in bases if (b / "cgroup.procs").exists()), bases[0])
    for procs in base.rglob("cgroup.procs"):
        try:
            pids += [int(p) for p in procs.read_text().split()]
        except OSError:
            continue
    return pids


def daemon_pss() -> int:
    """leviathd's private memory (what it alone holds; its PSS falls as
    supervisors forked from it share its pages)."""
    pid = subprocess.run(
        ["systemctl", "show", "-P", "MainPID", "leviathd"], capture_output=True, text=True
    ).stdout.strip()
    return private_kib(int(pid)) if pid and pid != "0" else 0


def daemon_facts() -> dict[str, int]:
    """leviathd's main PID: private memory, RSS and open descriptors."""
    pid = subprocess.run(
        ["systemctl", "show", "-P", "MainPID", "leviathd"], capture_output=True, text=True
    ).stdout.strip()
    if not pid or pid == "0":
        return {"daemon_pss_kib": 0, "daemon_rss_kib": 0, "daemon_fds": 0}
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmRSS:"))
    return {"daemon_pss_kib": private_kib(int(pid)), "daemon_rss_kib": rss,
            "daemon_fds": len(os.listdir(f"/proc/{pid}/fd"))}  # fmt: skip


def peer(n: int, window: int) -> dict[str, object]:
    """The peer of `starts`: N `systemd-run --scope sleep 600` as root under
    the same setpriv wrapper, with the agents' limits, each in its own scope
    of peer.slice, at most `window` of them still starting at a time. All
    at once fail: the bus takes 256 connections of one uid (root's 1,000:
    966 failed), and as four users asking polkit, systemd's own connection
    reaches the bus's 128 pending replies (694 of 1,000 failed). lev's
    1,000 come from four users, 250 each, under both. systemd-run execs
    sleep once the scope is there, so all running is N sleeps in the slice."""
    argv, home = as_user("root", [
        "systemd-run", "--scope", "--quiet", "--slice=peer.slice",
        "-p", "MemoryMax=512M", "-p", "TasksMax=256", "sleep", "600"])  # fmt: skip
    t0 = time.perf_counter()
    procs: list[subprocess.Popen[str]] = []
    starting: list[subprocess.Popen[str]] = []
    running = 0
    while time.perf_counter() - t0 < 900:
        starting = [p for p in starting if p.poll() is None and comm(p.pid) != "sleep"]
        while len(starting) < window and len(procs) < n:
            p = subprocess.Popen(argv, cwd=home, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)  # fmt: skip
            procs.append(p)
            starting.append(p)
        running = sum(1 for p in slice_pids("peer.slice") if comm(p) == "sleep")
        ended = sum(1 for p in procs if p.poll() is not None)
        if len(procs) >= n and running + ended >= n:
            break
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    errors: dict[str, int] = {}
    for p in procs:
        if p.poll() is not None:
            assert p.stderr is not None
            key = (p.stderr.read().strip().splitlines() or ["?"])[-1][:160]
            errors[key] = errors.get(key, 0) + 1
    subprocess.run(["systemctl", "stop", "peer.slice"], check=False)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    return {"n": n, "all_running_s": wall, "running": running,
            "failed": sum(errors.values()), "errors": errors}  # fmt: skip


def mem(units: list[str]) -> dict[str, object]:
    own_pss: list[int] = []
    own_private: list[int] = []
    own_procs: list[int] = []
    payload_pss: list[int] = []
    names: dict[str, int] = {}
    name_pss: dict[str, int] = {}
    for unit in units:
        pids = unit_pids(unit)
        mine = [p for p in pids if comm(p) != "sleep"]
        for p in mine:
            names[comm(p)] = names.get(comm(p), 0) + 1
            name_pss[comm(p)] = name_pss.get(comm(p), 0) + pss_kib(p)
        own_pss.append(sum(pss_kib(p) for p in mine))
        own_private.append(sum(private_kib(p) for p in mine))
        own_procs.append(len(mine))
        payload_pss.append(sum(pss_kib(p) for p in pids if comm(p) == "sleep"))
    n = max(len(units), 1)
    return {
        "agents": len(units),
        "own_pss_kib_per_agent": sum(own_pss) / n,
        "own_private_kib_per_agent": sum(own_private) / n,
        "own_procs_per_agent": sum(own_procs) / n,
        "payload_pss_kib_per_agent": sum(payload_pss) / n,
        "own_process_names": names,
        # PSS of one process of each name, on average
        "pss_kib_by_name": {k: round(v / names[k]) for k, v in name_pss.items()},
        "daemon_pss_kib": daemon_pss(),
    }


def as_user(user: str, argv: list[str]) -> tuple[list[str], str]:
    pw = pwd.getpwnam(user)
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups",
            "--reset-env", "--", "env", f"HOME={pw.pw_dir}", f"USER={user}",
            "PATH=/usr/local/bin:/usr/bin:/bin", *argv], pw.pw_dir  # fmt: skip


def starts(n: int, cmd: str, users: list[str]) -> dict[str, object]:
    procs = []
    t0 = time.perf_counter()
    for i in range(n):
        user = users[i % len(users)]
        argv, home = as_user(user, ["lev", "run", "--detach", "--workdir", f"{home_of(user)}/work",
                                    "--", *cmd.split()])  # fmt: skip
        procs.append(subprocess.Popen(argv, cwd=home, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    errors: dict[str, int] = {}
    ids = []
    each = []
    for p in procs:
        out, err = p.communicate()
        each.append(time.perf_counter() - t0)
        if p.returncode != 0:
            key = (err.strip().splitlines() or ["?"])[-1][:160]
            errors[key] = errors.get(key, 0) + 1
        else:
            ids.append(out.strip())
    # All running: every started agent's command runs (a detached start
    # returns before its fence is built and its command execs).
    cmd_name = os.path.basename(cmd.split()[0])
    while True:
        running = sum(1 for p in slice_pids() if comm(p) == cmd_name)
        if running >= len(ids) or time.perf_counter() - t0 > max(each) + 120:
            break
        time.sleep(0.05)
    return {"n": n, "wall_s": max(each), "p50_return_s": statistics.median(each),
            "all_running_s": time.perf_counter() - t0, "running": running,
            "failed": n - len(ids), "errors": errors}  # fmt: skip


def slice_pids(name: str = "leviath.slice") -> list[int]:
    """Every process in a slice (cgroup v2 or a hybrid's systemd tree)."""
    bases = [CGROOT / sub / name for sub in ("", "unified", "systemd")]
    base = next((b for b in bases if b.exists()), bases[0])
    pids: list[int] = []
    for procs in base.rglob("cgroup.procs"):
        try:
            pids += [int(p) for p in procs.read_text().split()]
        except OSError:
            continue
    return pids


def leftovers() -> dict[str, int]:
    """What no agent should leave once all are stopped: processes in the
    slice, scratch folders, exit records, leviathd processes beyond its main."""
    main = subprocess.run(["systemctl", "show", "-P", "MainPID", "leviathd"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    ours = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit() and entry != main:
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(a.endswith(b"/leviathd") for a in argv[:2]):
                ours += 1
    def count(folder: str) -> int:
        try:
            return len(os.listdir(folder))
        except OSError:
            return 0
    return {"slice_procs": len(slice_pids()), "scratch": count("/var/lib/leviath/scratch"),
            "exit_records": count("/run/leviath/exit"), "leviathd_procs": ours}  # fmt: skip


def home_of(user: str) -> str:
    return pwd.getpwnam(user).pw_dir


def timed(argv: list[str], cwd: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def list_cost(user: str, rounds: int) -> dict[str, float]:
    peers = {
        "lev ps": ["lev", "ps"],
        "busctl List": ["busctl", "--system", "call", "org.leviath.Manager1",
                        "/org/leviath/Manager1", "org.leviath.Manager1", "List", "b", "false"],
        # The same authorisation and sort as List, one row: List minus this
        # is what the rows cost, the part that grows with agents.
        "busctl ListPage limit 1": ["busctl", "--system", "call", "org.leviath.Manager1",
                                    "/org/leviath/Manager1", "org.leviath.Manager1", "ListPage",
                                    "a{sv}", "1", "limit", "u", "1"],
        "busctl GetId (bus floor)": ["busctl", "--system", "call", "org.freedesktop.DBus",
                                     "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetId"],
    }  # fmt: skip
    samples: dict[str, list[float]] = {k: [] for k in peers}
    for _ in range(rounds):
        for k, argv in peers.items():
            full, home = as_user(user, argv)
            samples[k].append(timed(full, home))
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}


def stopall(users: list[str]) -> dict[str, object]:
    t0 = time.perf_counter()

    def stop_user(user: str) -> int:
        argv, home = as_user(user, ["lev", "ps", "--json"])
        items = json.loads(subprocess.run(argv, cwd=home, capture_output=True, text=True,
                                          check=True).stdout)  # fmt: skip
        mine = [a["id"] for a in items if a.get("user") == user]

        def stop(agent_id: str) -> None:
            full, _h = as_user(user, ["lev", "stop", agent_id])
            subprocess.run(full, cwd=home, capture_output=True)

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(stop, mine))
        return len(mine)

    with ThreadPoolExecutor(len(users)) as pool:
        stopped = sum(pool.map(stop_user, users))
    wall = time.perf_counter() - t0
    # Nothing left behind: no agent scope still loaded (a stopped scope
    # takes a moment to go; up to 60 s is waited for).
    while True:
        units = subprocess.run(
            ["systemctl", "list-units", "--no-legend", "--plain", "--all", "leviath-*.scope"],
            capture_output=True, text=True,
        ).stdout
        left = [ln.split()[0] for ln in units.splitlines() if ln.strip()]
        if not left or time.perf_counter() - t0 > wall + 60:
            break
        time.sleep(0.5)
    # The daemon closes ended agents' records (exit records, scratch) just
    # after their scopes go: give it as long again.
    deadline = time.perf_counter() + 60
    rest = leftovers()
    while any(rest.values()) and time.perf_counter() < deadline:
        time.sleep(0.5)
        rest = leftovers()
    return {"stopped": stopped, "wall_s": wall, "units_left": left[:10], **rest,
            "all_gone_s": time.perf_counter() - t0,
            "units_left_count": len(left), "pid_count": len(os.listdir("/proc"))}  # fmt: skip


def main() -> None:
    what = sys.argv[1]
    if what == "mem":
        print(json.dumps(mem(sys.argv[2:])))
    elif what == "daemon":
        print(json.dumps(daemon_facts()))
    elif what == "peer":
        print(json.dumps(peer(int(sys.argv[2]), int(sys.argv[3]))))
    elif what == "starts":
        print(json.dumps(starts(int(sys.argv[2]), sys.argv[3], sys.argv[4:])))
    elif what == "list":
        print(json.dumps(list_cost(sys.argv[2], int(sys.argv[3]))))
    elif what == "stopall":
        print(json.dumps(stopall(sys.argv[2:])))
    else:
        raise SystemExit(f"unknown probe {what}")


if __name__ == "__main__":
    main()
