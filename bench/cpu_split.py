"""Where a start's CPU goes (issue 18): `lev run -- true` as kind namespace
and kind none against `systemd-run --scope true` with the same limits, run
--rounds times each in the test bed, with the CPU time of each of the bed's
cgroups read before and after (cpuacct on cgroup v1, cpu.stat on v2). What
the bed's own cgroup used beyond its children is the client side: `lev` or
`systemd-run`, and the `setpriv ... env` wrapper both run under.

Wall time moves with the machine's load; CPU time hardly does, so this says
which part to work on.

    sudo /opt/leviath-dev/venv/bin/python bench/cpu_split.py [--rounds 20] [--repo DIR]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO), str(HERE)]

from table import LIMITS, USERS, as_root, as_user, configure, user_kind_namespace  # noqa: E402
from testbed import Testbed  # noqa: E402

CLIENT = "client (the bed's own cgroup)"


def _usage_ns(cgroup: Path) -> int | None:
    acct = cgroup / "cpuacct.usage"
    if acct.exists():
        return int(acct.read_text())
    stat = cgroup / "cpu.stat"
    if stat.exists():
        fields = dict(ln.split() for ln in stat.read_text().splitlines())
        if "usage_usec" in fields:  # v2; v1's cpu controller has a cpu.stat without it
            return int(fields["usage_usec"]) * 1000
    return None


def snapshot(bed: Testbed) -> dict[str, int]:
    """CPU ns so far of every cgroup of the bed, by path below its root, from
    the hierarchy where the bed's systemd makes its cgroups (on a hybrid
    host the unified one, whose cpu.stat every cgroup has)."""
    best: dict[str, int] = {}
    for root in bed._cgroups:
        if _usage_ns(root) is None:
            continue
        out: dict[str, int] = {}
        for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
            used = _usage_ns(d)
            if used is not None:
                out[str(d.relative_to(root))] = used
        if len(out) > len(best):
            best = out
    if not best:
        raise RuntimeError("no CPU accounting for the bed's cgroup")
    return best


def split(before: dict[str, int], after: dict[str, int], n: int) -> dict[str, float]:
    """ms per start of each top-level part (slices, services, PID 1's scope)
    and of the client, what the root used beyond them."""
    ms = {k: (after.get(k, 0) - before.get(k, 0)) / 1e6 / n for k in after}
    parts = {k: v for k, v in ms.items() if k.count("/") == 1 and k.startswith("system.slice/")}
    parts.update({k: v for k, v in ms.items() if "/" not in k and k != "."})
    top = sum(v for k, v in ms.items() if "/" not in k and k != ".")
    parts.pop("system.slice", None)
    parts[CLIENT] = ms.get(".", 0.0) - top
    parts["total"] = ms.get(".", 0.0)
    return parts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repo", type=Path, default=REPO)
    args = ap.parse_args()
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(args.repo)
        bed.add_standard_users()
        for user in USERS:
            bed.run(["mkdir", "-p", f"{bed.users[user].home}/work"], user=user)
        configure(bed, "none", reload=False)
        user_kind_namespace(bed, "alice")
        bed.run(["systemctl", "restart", "leviathd"])
        props = [a for k, v in LIMITS.items() for a in ("-p", f"{k}={v}")]
        peers = {
            "systemd-run": as_root(["systemd-run", "--scope", "--quiet", *props, "true"]),
            "lev namespace": as_user(bed, "alice", ["lev", "run", "--workdir",
                                                    "/home/alice/work", "--", "true"]),
            "lev none": as_user(bed, "bob", ["lev", "run", "--workdir", "/home/bob/work",
                                             "--", "true"]),
        }  # fmt: skip
        got: dict[str, dict[str, float]] = {}
        for name, argv in peers.items():
            cmd = " ".join(shlex.quote(a) for a in argv)
            before = snapshot(bed)
            bed.run(f"for i in $(seq {args.rounds}); do {cmd} >/dev/null 2>&1; done",
                    cwd="/home/alice/work", timeout=1800)
            time.sleep(2)  # a start's teardown counts too
            got[name] = split(before, snapshot(bed), args.rounds)
        rows = sorted({k for v in got.values() for k in v},
                      key=lambda k: (k == "total", -got["lev namespace"].get(k, 0.0)))
        print("| CPU ms per start | " + " | ".join(peers) + " |")
        print("| --- |" + " --- |" * len(peers))
        for row in rows:
            cells = [f"{got[p].get(row, 0.0):.1f}" for p in peers]
            if any(float(c) >= 0.2 for c in cells):
                print(f"| {row} | " + " | ".join(cells) + " |")
        base = got["systemd-run"]["total"]
        for p in ("lev namespace", "lev none"):
            print(f"{p} / systemd-run, CPU: {got[p]['total'] / base:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
