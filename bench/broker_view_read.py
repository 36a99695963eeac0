"""The brokered read_file round trip from inside a namespace agent (issue 43:
the file worker opens in the agent's mount namespace; issue 47 measures the
read path as a whole). Boots the test bed (root) from the checkout given.
Inside one agent, on one broker connection (the kind `lev tool` and MCP
use), it times N read_file calls of a 4 KiB file, then N direct open+read
of the same file, printing p50/p90 of each (wall, moves with the load).
Around two runs of the agent, one with N calls and one with none, it reads
the CPU time of the daemon's service and of the agent's scope (bench/
cpu_split.py's snapshot): the difference over N is the CPU one brokered
read costs the daemon and the agent's side (client, file worker), which the
machine's load hardly moves.

    sudo /opt/leviath-dev/venv/bin/python bench/broker_view_read.py [CHECKOUT] [--calls N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ap = argparse.ArgumentParser()
ap.add_argument("checkout", nargs="?", default=str(HERE.parent))
ap.add_argument("--calls", type=int, default=2000)
ap.add_argument("--runs", type=int, default=2)
ARGS = ap.parse_args()
REPO = Path(ARGS.checkout).resolve()
sys.path[:0] = [str(REPO / "tests"), str(REPO), str(HERE)]

from cpu_split import snapshot  # noqa: E402
from testbed import Testbed  # noqa: E402

INSIDE = """
import json, os, socket, statistics, sys, time
n = int(sys.argv[1])
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["LEVIATH_BROKER"])
f = s.makefile("rb")
req = json.dumps({"op": "call", "tool": "read_file", "args": {"path": "f4k.txt"}}).encode()
def stats(times):
    times = sorted(times[20:])
    if not times:
        return None
    return {"p50_us": round(statistics.median(times), 1),
            "p90_us": round(times[int(len(times) * 0.9)], 1)}
brokered = []
for i in range(n):
    t = time.perf_counter()
    s.sendall(req + b"\\n")
    line = f.readline()
    brokered.append((time.perf_counter() - t) * 1e6)
    assert i or json.loads(line).get("ok"), line
direct = []
for i in range(n):
    t = time.perf_counter()
    fd = os.open("f4k.txt", os.O_RDONLY)
    os.read(fd, 1 << 20)
    os.close(fd)
    direct.append((time.perf_counter() - t) * 1e6)
print(json.dumps({"n": n, "brokered": stats(brokered), "direct": stats(direct)}))
"""


def _cpu_ms(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """ms of CPU in the daemon's service and in leviath.slice (the agent)."""
    out = {"daemon": 0.0, "agent": 0.0}
    for key, used in after.items():
        delta = (used - before.get(key, 0)) / 1e6
        if key == "system.slice/leviathd.service":
            out["daemon"] += delta
        elif key == "leviath.slice":
            out["agent"] += delta
    return out


def main() -> int:
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(REPO)
        bed.add_standard_users()
        bed.write_file("/etc/leviath/config.toml",
                       '[sandbox]\nkind = "namespace"\n[tool_permissions]\nread_file = "allow"\n')
        bed.run(["systemctl", "restart", "leviathd"])
        home = bed.users["alice"].home
        bed.run(f"mkdir -p {home}/rb && head -c 4096 /dev/zero | tr '\\0' a > {home}/rb/f4k.txt",
                user="alice")
        bed.run(["sh", "-c", "cat > rb/bench.py"], user="alice", cwd=home, input=INSIDE)

        def agent(n: int) -> tuple[dict[str, float], str]:
            before = snapshot(bed)
            r = bed.run(["lev", "run", "--", "python3", "bench.py", str(n)], user="alice",
                        cwd=f"{home}/rb", timeout=600)
            return _cpu_ms(before, snapshot(bed)), r.stdout.strip()

        agent(0)  # warm: the first agent pays for caches
        for _ in range(ARGS.runs):
            idle, _ = agent(0)
            busy, out = agent(ARGS.calls)
            per = {k: round((busy[k] - idle[k]) * 1000 / ARGS.calls, 1) for k in busy}
            print(json.dumps({**json.loads(out.splitlines()[-1]),
                              "cpu_us_per_call": per}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
