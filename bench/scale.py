"""Many agents at once (issue 18), in the test bed: for each N of --counts,
N concurrent `lev run --detach -- sleep 600` split over alice, bob and dave,
the time until every command runs, then PSS and processes per agent (ours:
all in an agent's scope but its `sleep`; a sample of --sample agents),
leviathd's own PSS, the cost (as dave, an admin who sees every agent)
of `List` (a bare `busctl call`, against `GetId` as the bus floor, and
against a one-row `ListPage`: the rows' own cost) and of
`lev ps`, the time to stop them all, and what is left behind (scopes,
processes in leviath.slice, scratch folders, exit records, leviathd
processes beyond the daemon).

    sudo /opt/leviath-dev/venv/bin/python bench/scale.py [--counts 50,150]
        [--kind namespace] [--network proxy] [--repo DIR]

500 agents need a machine with room.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO), str(HERE)]

from table import PROBE, USERS, configure, probe  # noqa: E402
from testbed import Testbed  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="50,150")
    ap.add_argument("--kind", default="namespace")
    ap.add_argument("--sample", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repo", type=Path, default=REPO)
    ap.add_argument("--network", default="", help='e.g. "proxy": [sandbox] network')
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(args.repo)
        bed.add_standard_users()
        bed.copy_in(HERE / "probe.py", PROBE)
        for user in USERS:
            bed.run(["mkdir", "-p", f"{bed.users[user].home}/work"], user=user)
        configure(bed, args.kind, f'network = "{args.network}"' if args.network else "",
                  reload=False)
        bed.start_service("leviathd")
        print("| agents | all started | all running | failed | own PSS (private)/agent | "
              "own procs/agent | leviathd private | busctl List - GetId | of which rows | "
              "lev ps | stop all | left |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for n in counts:
            idle = probe(bed, "daemon")["daemon_pss_kib"]
            got = probe(bed, "starts", str(n), "sleep 600", *USERS, timeout=3600)
            units = [a["unit"] for a in json.loads(
                bed.run(["lev", "ps", "--json"], user="dave", timeout=600).stdout)]  # fmt: skip
            mem = probe(bed, "mem", *units[: args.sample])
            cost = probe(bed, "list", "dave", str(args.rounds))  # an admin: every agent
            stop = probe(bed, "stopall", *USERS, timeout=3600)
            left = (f"{stop['units_left_count']} scopes, {stop['slice_procs']} procs, "
                    f"{stop['scratch']} scratch, {stop['exit_records']} exit records, "
                    f"{stop['leviathd_procs']} extra leviathd")
            print(f"| {n} | {got['wall_s']:.1f} s | {got['all_running_s']:.1f} s | "
                  f"{got['failed']} | "
                  f"{mem['own_pss_kib_per_agent'] / 1024:.1f} "
                  f"({mem['own_private_kib_per_agent'] / 1024:.1f}) MB | "
                  f"{mem['own_procs_per_agent']:.1f} | "
                  f"{idle / 1024:.0f} -> {mem['daemon_pss_kib'] / 1024:.0f} MB | "
                  f"{cost['busctl List'] - cost['busctl GetId (bus floor)']:.0f} ms | "
                  f"{cost['busctl List'] - cost['busctl ListPage limit 1']:.1f} ms | "
                  f"{cost['lev ps']:.0f} ms | {stop['wall_s']:.1f} s | "
                  f"{left} |", flush=True)  # fmt: skip
            print(f"  PSS KiB by process name: {mem['pss_kib_by_name']}", flush=True)
            if got["failed"]:
                print(f"  errors: {got['errors']}", flush=True)
                errs = bed.run("journalctl -u leviathd --no-pager -o cat | grep -iE "
                               "'supervisor|traceback|error|warn|fail' | tail -n 40",
                               check=False).stdout
                print("  leviathd's complaints:\n    " + errs.replace("\n", "\n    "), flush=True)
            if any(stop[k] for k in ("scratch", "exit_records", "slice_procs")):
                print("  left: " + bed.run("ls /var/lib/leviath/scratch /run/leviath/exit",
                                           check=False).stdout.replace("\n", " "), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
