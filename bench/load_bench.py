"""Alice's calls while bob sends hostile blueprints (issue 22), in the test bed.

Boots the test bed (needs root), installs the checkout, runs the daemon with
kind = "container" (a busybox image built in the bed), and prints alice's
`List` call (the daemon's part of `lev ps`, from one connection) and her whole
`lev ps` (client start to exit), first idle and then while one process of
bob's sends Run requests four at a time: a 500-stage, a 10 MB and a
100,000-deep blueprint (each refused by a bound), and then the largest
blueprint the bounds accept (64 stages, 250 KiB; fully parsed and planned).

    sudo /opt/leviath-dev/venv/bin/python bench/load_bench.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from integration.test_container import (  # noqa: E402
    BUILD_IMAGE,
    Load,
    config,
    lev_ps_seconds,
    list_latencies,
    ms,
    write_blueprints,
)
from testbed import Testbed  # noqa: E402


def largest_accepted(bed: Testbed) -> str:
    text = '[agent]\nname = "big"\n' + "".join(
        f'[stages.s{i}]\ncommand = ["false"]\n' for i in range(64)
    )
    text += "# padding\n" * ((250 * 1024 - len(text)) // 10)
    folder = f"{bed.users['bob'].home}/largest"
    bed.run(["mkdir", "-p", folder], user="bob")
    bed.run(f"cat > {folder}/blueprint.toml", user="bob", input=text)
    return folder


def measure(bed: Testbed, rounds: int, label: str, folders: list[str] | None) -> float:
    if folders is None:
        calls = list_latencies(bed, rounds)
        ps = [lev_ps_seconds(bed, "alice") for _ in range(5)]
        note = ""
    else:
        with Load(bed, folders) as load:
            calls = list_latencies(bed, rounds)
            ps = [lev_ps_seconds(bed, "alice") for _ in range(5)]
        sent, refused, lost = load.counts.split()
        note = f"  (bob: {sent} answered, {refused} refused, {lost} lost)"
    print(f"  {label:44} List {ms(calls)}; lev ps {ms(ps)}{note}")
    return statistics.median(calls)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(REPO)
        bed.add_standard_users()
        r = bed.run(BUILD_IMAGE, check=False, timeout=300)
        if r.returncode != 0:
            print(f"cannot build the image in the bed: {r.stderr.strip()}")
            return 1
        for user in ("alice", "bob"):
            bed.run(["mkdir", "-p", "cwork"], user=user)
        bed.write_file("/etc/leviath/config.toml", config(extra='on_unavailable = "error"'))
        bed.start_service("leviathd")
        hostile = [folder for folder, _ in write_blueprints(bed, "bob").values()]
        print(f"alice's calls, {args.rounds} List calls and 5 lev ps each "
              "(container kind, shared CPUs):")  # fmt: skip
        idle = measure(bed, args.rounds, "idle", None)
        refused = measure(bed, args.rounds, "bob: 500 stages, 10 MB, 100,000 deep", hostile)
        measure(bed, args.rounds, "bob: 64 stages, 250 KiB (accepted)", [largest_accepted(bed)])
        print(f"  List time added by the refused load: {(refused - idle) * 1000:.0f} ms "
              "(aim: < 100 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
