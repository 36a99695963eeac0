"""Many agents at once (issue 18), in the test bed: for each N of --counts,
N concurrent `lev run --detach -- sleep 600` split over alice, bob, dave and
erin (four users by default, erin added here; --users 3-9), the time until every command runs,
against N `systemd-run --scope sleep 600` (root, same limits and wrapper,
250 starting at a time: more at once exceed the bus's limits, see
probe.py; --no-peer leaves it out), then PSS and processes per agent (ours:
all in an agent's scope but its `sleep`; a sample of --sample agents),
leviathd's own PSS, the cost (as dave, an admin who sees every agent)
of `List` (a bare `busctl call`, against `GetId` as the bus floor, and
against a one-row `ListPage`: the rows' own cost) and of
`lev ps`, the time to stop them all, and what is left behind (scopes,
processes in leviath.slice, scratch folders, exit records, leviathd
processes beyond the daemon), and leviathd's RSS and open descriptors
before, at N and after all stopped. The load average is printed with each
row: the figures move with it, the ratios less.

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

EXTRA = ("erin", "frank", "grace", "heidi", "ivan", "judy")  # more users of group leviath


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--counts", default="50,150")
    ap.add_argument("--kind", default="namespace")
    ap.add_argument("--sample", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repo", type=Path, default=REPO)
    ap.add_argument("--network", default="", help='e.g. "proxy": [sandbox] network')
    ap.add_argument("--no-peer", action="store_true", help="leave out systemd-run's row")
    ap.add_argument("--users", type=int, default=4, help="3 to 9: how many users start agents")
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    users = (*USERS, *EXTRA)[: max(3, min(args.users, 3 + len(EXTRA)))]
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(args.repo)
        bed.add_standard_users()
        for name in users[len(USERS):]:
            if name not in bed.users:
                bed.add_user(name, ("leviath",))
        bed.copy_in(HERE / "probe.py", PROBE)
        for user in users:
            bed.run(["mkdir", "-p", f"{bed.users[user].home}/work"], user=user)
        configure(bed, args.kind, f'network = "{args.network}"' if args.network else "",
                  reload=False)
        bed.start_service("leviathd")
        print("| agents | all started | all running | failed | own PSS (private)/agent | "
              "own procs/agent | leviathd private | busctl List - GetId | of which rows | "
              "lev ps | stop all | left |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        facts = []
        for n in counts:
            load = bed.run(["cat", "/proc/loadavg"]).stdout.split()[:3]
            peer = None if args.no_peer else probe(bed, "peer", str(n), "250", timeout=3600)
            before = probe(bed, "daemon")
            idle = before["daemon_pss_kib"]
            got = probe(bed, "starts", str(n), "sleep 600", *users, timeout=3600)
            at_n = probe(bed, "daemon")
            rows = json.loads(bed.run(["lev", "ps", "--json", "--all"], user="dave",
                                      timeout=600).stdout)  # fmt: skip
            units = [a["unit"] for a in rows if a["state"] == "running"]
            states: dict[str, int] = {}
            for a in rows:
                key = f"{a['state']} {a.get('exit_status', '')}".strip()
                states[key] = states.get(key, 0) + 1
            print(f"  {n}: {got['running']} commands seen running of "
                  f"{n - got['failed']} started; records: {states}", flush=True)
            if got["running"] < n - got["failed"]:
                errs = bed.run("journalctl --no-pager -o cat -p warning | sort | uniq -c | "
                               "sort -rn | head -n 15", check=False).stdout
                print("  the journal's warnings:\n    " + errs.replace("\n", "\n    "),
                      flush=True)
            mem = probe(bed, "mem", *units[: args.sample])
            cost = probe(bed, "list", "dave", str(args.rounds))  # an admin: every agent
            stop = probe(bed, "stopall", *users, timeout=3600)
            after = probe(bed, "daemon")
            facts.append((n, load, peer, got, before, at_n, after))
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
        print()
        print("| agents | load before | systemd-run all running | lev all running | ratio | "
              "leviathd RSS before -> at N -> after stop | fds before -> at N -> after |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for n, load, peer, got, before, at_n, after in facts:
            ps = f"{peer['all_running_s']:.1f} s ({peer['failed']} failed)" if peer else "-"
            if peer and peer["failed"]:
                print(f"  systemd-run's errors at {n}: {peer['errors']}")
            ratio = f"{got['all_running_s'] / peer['all_running_s']:.2f}x" if peer else "-"
            rss = " -> ".join(f"{d['daemon_rss_kib'] / 1024:.1f}" for d in (before, at_n, after))
            fds = " -> ".join(str(d["daemon_fds"]) for d in (before, at_n, after))
            print(f"| {n} | {' '.join(load)} | {ps} | {got['all_running_s']:.1f} s | {ratio} | "
                  f"{rss} MB | {fds} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
