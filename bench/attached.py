"""Attached agents' cost in processes of ours (issue 18), in the test bed:
--agents concurrent attached `lev run -- sleep 600` (as alice, each `lev`
reading its pipes), then PSS and processes per agent (ours: all in an
agent's scope but its `sleep`), the daemon's own PSS growth per agent, and
the same for seeded agents (which keep their supervisor).

    sudo /opt/leviath-dev/venv/bin/python bench/attached.py [--agents 10] [--repo DIR]
        [--kind namespace|none]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO), str(HERE)]

from table import PROBE, configure, probe  # noqa: E402
from testbed import Testbed  # noqa: E402


def _measure(bed: Testbed, n: int, argv: list[str], label: str) -> None:
    idle = probe(bed, "daemon")["daemon_pss_kib"]
    home = bed.users["alice"].home
    clients = [subprocess.Popen(bed.command(argv, user="alice", cwd=f"{home}/work"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(n)]
    try:
        deadline = time.monotonic() + 120
        units: list[str] = []
        while time.monotonic() < deadline:
            rows = json.loads(bed.run(["lev", "ps", "--json"], user="alice").stdout)
            units = [r["unit"] for r in rows]
            if len(units) == n:
                break
            time.sleep(0.5)
        time.sleep(2)  # the held children leave, the seeds end
        mem = probe(bed, "mem", *units)
        growth = (mem["daemon_pss_kib"] - idle) / max(len(units), 1)
        print(f"| {label} | {len(units)} | {mem['own_pss_kib_per_agent'] / 1024:.2f} MB "
              f"({mem['own_private_kib_per_agent'] / 1024:.2f} MB private) | "
              f"{mem['own_procs_per_agent']:.1f} {mem['own_process_names']} | "
              f"{growth:.0f} KiB |", flush=True)
    finally:
        for row in json.loads(bed.run(["lev", "ps", "--json"], user="alice").stdout):
            bed.run(["lev", "stop", row["id"]], user="alice", check=False)
        for client in clients:
            try:
                client.wait(timeout=30)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--repo", type=Path, default=REPO)
    ap.add_argument("--kind", default="namespace", help="the machine's sandbox kind (none too)")
    args = ap.parse_args()
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(args.repo)
        bed.add_standard_users()
        bed.copy_in(HERE / "probe.py", PROBE)
        home = bed.users["alice"].home
        bed.run(["mkdir", "-p", f"{home}/work", f"{home}/seeded"], user="alice")
        bed.run(f"cat > {home}/seeded/blueprint.toml", user="alice",
                input='[agent]\nname = "seeded"\ncommand = ["sleep", "600"]\n'
                      '[seed]\ncommands = [["true"]]\n')
        configure(bed, args.kind, reload=False)
        bed.start_service("leviathd")
        print("| agents | n | own PSS per agent | own processes per agent | "
              "leviathd PSS growth per agent |")
        print("| --- | --- | --- | --- | --- |")
        _measure(bed, args.agents, ["lev", "run", "--", "sleep", "600"], "attached `lev run`")
        _measure(bed, args.agents, ["lev", "run", f"{home}/seeded"], "attached, seeded")
        _measure(bed, args.agents, ["lev", "run", "--detach", "--", "sleep", "600"],
                 "detached `lev run --detach`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
