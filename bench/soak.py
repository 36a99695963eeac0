"""Soak (issue 24): agents from three users for MINUTES minutes in the test bed,
with `lev ps --all` running beside them, then the slopes that show a leak:
daemon RSS and file descriptors per 1,000 agents, records on disk, and what
is left behind (scopes, scratch and runtime folders, bus disconnects, daemon
restarts). Opt-in, as root (it boots the test bed, never the host's systemd):

    sudo PYTHONPATH=.:tests /opt/leviath-dev/venv/bin/python bench/soak.py --minutes 10

Prints one sample line per interval and a summary; exits 1 if anything was
left behind, a call failed or the daemon restarted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from testbed import Testbed  # noqa: E402

CONFIG = """
[sandbox]
kind = "namespace"

[records]
keep_days = 30
max_per_user = 500
"""


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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2, help="agent loops per user")
    a = ap.parse_args()
    bed = Testbed()
    try:
        bed.start()
        bed.wait_running()
        bed.install_project(REPO)
        bed.add_standard_users()
        bed.write_file("/etc/leviath/config.toml", CONFIG)
        bed.start_service("leviathd.service")
        users = ("alice", "bob", "dave")
        for user in users:
            bed.run(["mkdir", "-p", "work"], user=user)
        first_pid = sample(bed)[0]
        started = [0]
        failures: list[str] = []
        stop = time.monotonic() + a.minutes * 60

        def agents(user: str) -> None:
            cwd = f"{bed.users[user].home}/work"
            while time.monotonic() < stop:
                r = bed.run(["lev", "run", "--", "sh", "-c", "echo soak; exit 3"], user=user,
                            cwd=cwd, check=False, timeout=120)
                if r.returncode == 3:
                    started[0] += 1
                else:
                    failures.append(f"{user} run: {r.returncode} {r.stderr.strip()[-200:]}")

        def lister() -> None:
            cwd = f"{bed.users['dave'].home}/work"
            while time.monotonic() < stop:
                r = bed.run(["lev", "ps", "--all", "--json"], user="dave", cwd=cwd,
                            check=False, timeout=120)
                if r.returncode != 0:
                    failures.append(f"ps: {r.stderr.strip()[-200:]}")
                time.sleep(1)

        threads = [threading.Thread(target=agents, args=(u,)) for u in users
                   for _ in range(a.workers)] + [threading.Thread(target=lister)]
        for t in threads:
            t.start()
        xs: list[float] = []
        rss: list[float] = []
        fds: list[float] = []
        t0 = time.monotonic()
        while time.monotonic() < stop:
            time.sleep(max(0.0, min(a.interval, stop - time.monotonic())))
            pid, r_kb, n_fd = sample(bed)
            xs.append(started[0])
            rss.append(r_kb)
            fds.append(n_fd)
            print(f"{time.monotonic() - t0:7.0f}s agents={started[0]} pid={pid} "
                  f"rss={r_kb} KiB fds={n_fd} failures={len(failures)}", flush=True)
        for t in threads:
            t.join()
        time.sleep(3)
        last_pid = sample(bed)[0]
        scopes = bed.run("systemctl list-units --all --no-legend 'leviath-*.scope' | wc -l"
                         ).stdout.strip()
        scratch = bed.run("ls /var/lib/leviath/scratch 2>/dev/null | wc -l").stdout.strip()
        runtime = " ".join(bed.run("ls /run/leviath/agents 2>/dev/null", check=False
                                   ).stdout.split()) or "none"
        records = bed.run("ls /var/lib/leviath/agents | grep -c '^[0-9a-f]*\\.json$'",
                          check=False).stdout.strip()
        print()
        print(f"agents: {started[0]} in {a.minutes:g} min "
              f"({started[0] / a.minutes * 60:.0f} an hour); failed calls: {len(failures)}")
        print(f"daemon RSS slope: {slope(xs, rss) * 1000:+.0f} KiB per 1,000 agents "
              f"({rss[0] if rss else 0:.0f} -> {rss[-1] if rss else 0:.0f} KiB)")
        print(f"daemon fd slope: {slope(xs, fds) * 1000:+.1f} per 1,000 agents "
              f"({fds[0] if fds else 0:.0f} -> {fds[-1] if fds else 0:.0f})")
        print(f"records on disk: {records} (retention: 500 per user)")
        print(f"left behind: scopes={scopes} scratch={scratch} agents' runtime folders: "
              f"{runtime}; "
              f"daemon restarted: {'yes' if last_pid != first_pid else 'no'}")
        for f in failures[:5]:
            print("  failure:", f)
        bad = (failures or last_pid != first_pid or scopes != "0" or scratch != "0"
               or runtime != "none")
        return 1 if bad else 0
    finally:
        bed.stop()


if __name__ == "__main__":
    sys.exit(main())
