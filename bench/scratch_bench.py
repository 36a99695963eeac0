"""An agent's scratch on disk (issue 33; sandbox/loopfs.py), in the test bed:

1. I/O: an agent (`lev run`, kind namespace) writes 500 MB into its /tmp
   and reads them back (dd; once through the page cache, once with
   conv=fsync and direct reads), against the same
   commands run directly on the host's disk (a root folder beside the
   scratch images, the same ext4), rounds alternated in one run; prints the
   median of each and the ratio (aim: at most 1.2x).
2. Start: `lev run -- true` with the scratch an ext4 of its own against the
   old tmpfs (the bed's /dev/loop-control taken away, so the daemon falls
   back), blocks alternated; prints the medians and the difference.

    sudo /opt/leviath-dev/venv/bin/python bench/scratch_bench.py [--rounds 5] [--mb 500]
        [--starts 10] [--repo DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO), str(HERE)]

from testbed import Testbed  # noqa: E402

MEMORY = "512M"
CONFIG = f'[sandbox]\nkind = "namespace"\n\n[resources]\nmemory_max = "{MEMORY}"\n'
# Not an execution id (it starts with a dot): the daemon's sweep leaves it.
HOST_DIR = "/var/lib/leviath/scratch/.bench-host"


def workload(folder: str, mb: int, synced: bool) -> str:
    """Write `mb` MB and read them back; `synced`: fsync'd and read with
    direct I/O (on the scratch, whose ext4 is mounted nobarrier, an fsync
    does not reach the host's disk: nothing there outlives the agent)."""
    sync, direct = (" conv=fsync", " iflag=direct") if synced else ("", "")
    # Timed inside, so an agent's start and end are not counted (starts()).
    return (f"s=$(date +%s%N); "
            f"dd if=/dev/zero of={folder}/big bs=1M count={mb}{sync} 2>/dev/null && "
            f"dd if={folder}/big of=/dev/null bs=1M{direct} 2>/dev/null && "
            f"rm {folder}/big && echo $(( $(date +%s%N) - s ))")


def timed(bed: Testbed, argv: list[str], user: str | None, *, inner: bool = False) -> float:
    """Seconds `argv` took: from outside, or as it printed (`inner`, ns)."""
    cwd = f"{bed.users['alice'].home}/work" if user else None
    start = time.perf_counter()
    r = bed.run(argv, user=user, cwd=cwd, timeout=600)
    if inner:
        return int(r.stdout.split()[-1]) / 1e9
    return time.perf_counter() - start


def io(bed: Testbed, rounds: int, mb: int, synced: bool) -> None:
    bed.run(["mkdir", "-p", "-m", "0700", HOST_DIR])
    agent = ["lev", "run", "--", "sh", "-c", workload("/tmp", mb, synced)]
    # The host's peer under the agent's memory limit too (a scope of its own).
    host = ["systemd-run", "--scope", "--quiet", "-p", f"MemoryMax={MEMORY}", "sh", "-c",
            workload(HOST_DIR, mb, synced)]
    times: dict[str, list[float]] = {"agent, /tmp in scratch": [], "host, same disk": []}
    for n in range(rounds):
        pair = [("agent, /tmp in scratch", agent, "alice"), ("host, same disk", host, None)]
        for label, argv, user in pair if n % 2 == 0 else pair[::-1]:
            times[label].append(timed(bed, argv, user, inner=True))
    bed.run(["rm", "-rf", HOST_DIR])
    a, h = (statistics.median(v) for v in times.values())
    how = "fsync + read back (direct)" if synced else "+ read back (page cache)"
    print(f"\n| write {mb} MB {how} | median of {rounds} |")
    print("| --- | --- |")
    for label, v in times.items():
        print(f"| {label} | {statistics.median(v):.2f} s ({', '.join(f'{x:.2f}' for x in v)}) |")
    print(f"| ratio agent / host | {a / h:.2f}x |", flush=True)


def _loop_control(bed: Testbed, present: bool) -> None:
    if present:
        bed.run(["sh", "-c",
                 "[ -e /dev/loop-control ] || mknod -m 0600 /dev/loop-control c 10 237"])
    else:
        bed.run(["sh", "-c", "umount /dev/loop-control 2>/dev/null; rm -f /dev/loop-control"])


def starts(bed: Testbed, rounds: int, per_block: int) -> None:
    times: dict[str, list[float]] = {"ext4": [], "tmpfs": []}
    try:
        for n in range(rounds):
            order = ["ext4", "tmpfs"] if n % 2 == 0 else ["tmpfs", "ext4"]
            for kind in order:
                _loop_control(bed, kind == "ext4")
                for _ in range(per_block):
                    times[kind].append(timed(bed, ["lev", "run", "--", "true"], "alice"))
    finally:
        _loop_control(bed, True)
    e, t = statistics.median(times["ext4"]), statistics.median(times["tmpfs"])
    print(f"\n| `lev run -- true` | median of {len(times['ext4'])} |")
    print("| --- | --- |")
    print(f"| scratch an ext4 of its own (loop device) | {e * 1000:.1f} ms |")
    print(f"| scratch a tmpfs (no loop devices) | {t * 1000:.1f} ms |")
    print(f"| difference | {(e - t) * 1000:+.1f} ms ({e / t:.2f}x) |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mb", type=int, default=500)
    ap.add_argument("--starts", type=int, default=10, help="starts per block (4 blocks each)")
    ap.add_argument("--repo", type=Path, default=REPO)
    args = ap.parse_args()
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(args.repo)
        bed.add_standard_users()
        bed.run(["mkdir", "-p", f"{bed.users['alice'].home}/work"], user="alice")
        bed.write_file("/etc/leviath/config.toml", CONFIG)
        bed.start_service("leviathd")
        io(bed, args.rounds, args.mb, synced=False)
        io(bed, args.rounds, args.mb, synced=True)
        starts(bed, 4, args.starts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
