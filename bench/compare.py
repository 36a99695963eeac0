"""Issue 18's start-latency rows for two trees in one test bed, alternated:
the before/after of a change measured in the same conditions (the machine's
load moves every absolute figure; alternating spreads it over both trees).

Each pass installs one tree, restarts leviathd and times, interleaved as in
bench/table.py: `systemd-run --scope true` (the floor), `lev run -- true` as
kind none and namespace, `lev tool read_file` inside an agent against
`python3 -c pass` there, and (unless --no-container) kind container against
namespace. It prints the medians over all passes of each tree and the ratios
the issue asks for. With --cpu (or --cpu-only), also the CPU time per start
of everything in the bed (client, bus, polkit, systemd, daemon, agent,
engine), which the machine's load hardly moves, unlike wall time.

    sudo /opt/leviath-dev/venv/bin/python bench/compare.py BEFORE_TREE AFTER_TREE
        [--passes 3] [--rounds 10] [--no-container] [--low] [--cpu | --cpu-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE.parent), str(HERE)]

from table import (  # noqa: E402
    INNER,
    LIMITS,
    PY,
    as_root,
    as_user,
    blueprint,
    configure,
    interleaved,
    user_kind_namespace,
)  # fmt: skip
from testbed import Testbed  # noqa: E402

STAT = "median_ms"


def cpu_peers(bed: Testbed, container: str | None) -> dict[str, list[str]]:
    lev = ["lev", "run", "--workdir", "/home/alice/work"]
    props = [a for k, v in LIMITS.items() for a in ("-p", f"{k}={v}")]
    peers = {
        "systemd-run": as_root(["systemd-run", "--scope", "--quiet", *props, "true"]),
        "none": as_user(bed, "bob", ["lev", "run", "--workdir", "/home/bob/work", "--", "true"]),
        "namespace": as_user(bed, "alice", [*lev, "--", "true"]),
    }
    if container:
        peers["container"] = as_user(bed, "alice", [*lev, container])
    return peers


def one_pass(bed: Testbed, rounds: int, container: str | None) -> dict[str, float]:
    lev = ["lev", "run", "--workdir", "/home/alice/work", "--", "true"]
    lev_ns = ["lev", "run", "--workdir", "/home/alice/work", "/home/alice/bp-true"]
    props = [a for k, v in LIMITS.items() for a in ("-p", f"{k}={v}")]
    # Same command line: alice's config asks for namespace, bob gets none.
    peers = {
        "systemd-run": as_root(["systemd-run", "--scope", "--quiet", *props, "true"]),
        "none": as_user(bed, "bob", ["lev", "run", "--workdir", "/home/bob/work", "--", "true"]),
        "namespace": as_user(bed, "alice", lev),
        "none, --detach": as_user(bed, "bob", ["lev", "run", "--detach", "--workdir",
                                               "/home/bob/work", "--", "true"]),
    }
    out = {k: v[STAT] for k, v in interleaved(bed, rounds, peers).items()}
    if container:
        # Apart, with a pause after each: a container's teardown (the
        # engine's rm) goes on after its run ends and would slow the next.
        ct = interleaved(bed, rounds, {
            "namespace": as_user(bed, "alice", lev_ns),
            "container": as_user(bed, "alice", ["lev", "run", "--workdir", "/home/alice/work",
                                                container]),
        }, pause_s=1.5)  # fmt: skip
        out["namespace (beside container)"] = ct["namespace"][STAT]
        out["container"] = ct["container"][STAT]
    tool_inner = json.dumps({"rounds": rounds, "peers": {
        "lev tool": ["lev", "tool", "read_file", "f.txt"],
        "python3 -c pass": [PY, "-c", "pass"],
    }})  # fmt: skip
    r = bed.run(as_user(bed, "alice", [*lev[:-1], PY, INNER, tool_inner]),
                cwd="/home/alice/work", timeout=1800).stdout  # fmt: skip
    t = json.loads(r.strip().splitlines()[-1])
    out["lev tool"] = t["lev tool"][STAT]
    out["python3 -c pass (agent)"] = t["python3 -c pass"][STAT]
    # The daemon's own part (request to release), from this instance's journal.
    inv = bed.run(["systemctl", "show", "-p", "InvocationID", "--value", "leviathd"]).stdout
    journal = bed.run(["journalctl", "-o", "json", "--no-pager", "LEVIATH_EVENT=start",
                       f"_SYSTEMD_INVOCATION_ID={inv.strip()}"]).stdout  # fmt: skip
    for kind in ("none", "namespace", "container"):
        usec = [int(e["LEVIATH_SPAWN_USEC"]) for e in map(json.loads, journal.splitlines())
                if e.get("LEVIATH_SANDBOX") == kind and "LEVIATH_SPAWN_USEC" in e]  # fmt: skip
        if usec:
            out[f"daemon's part, {kind}"] = statistics.median(usec) / 1e3
    return out


def bed_cpu_ns(bed: Testbed) -> int:
    """CPU time used so far by everything in the bed (its cgroup on the host:
    cpuacct on v1, cpu.stat on v2): the client, bus, polkit, systemd, the
    daemon, the agent and the engine alike."""
    for cg in bed._cgroups:
        if (cg / "cpuacct.usage").exists():
            return int((cg / "cpuacct.usage").read_text())
        if (cg / "cpu.stat").exists():
            stat = dict(ln.split() for ln in (cg / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) * 1000
    raise RuntimeError("no CPU accounting for the bed's cgroup")


def cpu_per_start(bed: Testbed, peers: dict[str, list[str]], n: int) -> dict[str, float]:
    """CPU ms per start, all processes of the bed counted, less what the bed
    uses idle over the same time: unlike wall time, hardly moved by the
    machine's load (other processes' CPU is not counted)."""
    import shlex
    import time

    def used(script: str) -> tuple[float, float]:
        c0, t0 = bed_cpu_ns(bed), time.monotonic()
        bed.run(script, cwd="/home/alice/work", timeout=1800)
        time.sleep(2)  # what a start leaves going on (teardown) is counted too
        return (bed_cpu_ns(bed) - c0) / 1e6, time.monotonic() - t0

    idle_ms, idle_s = used("sleep 3")
    out = {}
    for name, argv in peers.items():
        cmd = " ".join(shlex.quote(a) for a in argv)
        ms, secs = used(f"for i in $(seq {n}); do {cmd} >/dev/null 2>&1; done")
        out[f"CPU per start, {name}"] = (ms - idle_ms / idle_s * secs) / n
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--no-container", dest="container", action="store_false")
    ap.add_argument("--cpu", action="store_true",
                    help="also the CPU time per start of everything in the bed")
    ap.add_argument("--cpu-only", action="store_true", help="only that")
    ap.add_argument("--low", action="store_true",
                    help="each pass's lower quartile instead of its median (a loaded machine)")
    args = ap.parse_args()
    global STAT
    STAT = "p25_ms" if args.low else "median_ms"
    args.cpu = args.cpu or args.cpu_only
    trees = {"before": args.before, "after": args.after}
    got: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    with Testbed() as bed:
        bed.wait_running()
        bed.add_standard_users()
        bed.copy_in(HERE / "spawn_inner.py", INNER)
        bed.run(["mkdir", "-p", "/home/alice/work"], user="alice")
        bed.run(["mkdir", "-p", "/home/bob/work"], user="bob")
        user_kind_namespace(bed, "alice")
        bed.run("echo hello > /home/alice/work/f.txt", user="alice")
        blueprint(bed, "true", "namespace", ["true"])
        container = None
        image = ""
        if args.container:
            from integration.test_container import BUILD_IMAGE, IMAGE

            if bed.run(["sh", "-c", BUILD_IMAGE], timeout=600, check=False).returncode == 0:
                container, image = blueprint(bed, "ct", "container", ["true"]), IMAGE
        for n in range(args.passes):
            for name, tree in trees.items():
                bed.install_project(tree)
                configure(bed, "none", f'image = "{image}"' if image else "", reload=False)
                bed.run(["systemctl", "restart", "leviathd"])
                res = {} if args.cpu_only else one_pass(bed, args.rounds, container)
                if args.cpu:
                    res.update(cpu_per_start(bed, cpu_peers(bed, container), args.rounds))
                for k, v in res.items():
                    got[name].setdefault(k, []).append(v)
                print(f"pass {n + 1} {name}: " + ", ".join(
                    f"{k} {v[-1]:.0f}" for k, v in got[name].items()), file=sys.stderr)  # fmt: skip
    med = {name: {k: statistics.median(v) for k, v in rows.items()} for name, rows in got.items()}
    print("(systemd-run runs as root under the same `setpriv ... env` wrapper as `lev` runs as "
          "its user: the wrapper's cost cancels out of the ratios)")
    print("| row | before | after |\n| --- | --- | --- |")
    for k in med["before"]:
        after = med["after"].get(k, float("nan"))
        print(f"| {k} (ms, {STAT[:-3]}, median of passes) | {med['before'][k]:.0f} "
              f"| {after:.0f} |")

    def ratios(m: dict[str, float]) -> list[str]:
        if "namespace" not in m:
            return ["-"] * 4
        return [
            f"{m['namespace'] / m['systemd-run']:.2f}x",
            f"{m['namespace'] - m['none']:+.0f} ms",
            f"{m['lev tool'] / m['python3 -c pass (agent)']:.2f}x",
            f"{m['container'] / m['namespace (beside container)']:.2f}x"
            if "container" in m else "-",
        ]

    labels = ["`lev run -- true` namespace / systemd-run", "fence overhead (namespace - none)",
              "`lev tool` / python3 -c pass", "container / namespace"]  # fmt: skip
    for label, b, a in zip(labels, ratios(med["before"]), ratios(med["after"]), strict=True):
        print(f"| {label} | {b} | {a} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
