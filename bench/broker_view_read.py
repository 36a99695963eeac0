"""The brokered read_file round trip from inside a namespace agent (issue 43:
the file worker now opens in the agent's mount namespace, entered once per
worker; issue 47 measures the read path as a whole). Boots the test bed
(root) from the checkout given, and three times runs 600 read_file calls
of a 4 KiB file over the agent's broker socket, one connection, printing
p50/p90 of the last 580. Run it against two checkouts to compare.

    sudo /opt/leviath-dev/venv/bin/python bench/broker_view_read.py [CHECKOUT]
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from testbed import Testbed  # noqa: E402

INSIDE = """
import json, os, socket, statistics, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["LEVIATH_BROKER"])
f = s.makefile("rb")
req = json.dumps({"op": "call", "tool": "read_file", "args": {"path": "f4k.txt"}}).encode()
times = []
for i in range(600):
    t = time.perf_counter()
    s.sendall(req + b"\\n")
    line = f.readline()
    times.append((time.perf_counter() - t) * 1e6)
    assert i or json.loads(line).get("ok"), line
times = sorted(times[20:])
print(json.dumps({"n": len(times), "p50_us": round(statistics.median(times)),
                  "p90_us": round(times[int(len(times) * 0.9)])}))
"""


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
        for _ in range(3):
            r = bed.run(["lev", "run", "--", "python3", "bench.py"], user="alice",
                        cwd=f"{home}/rb", timeout=300)
            print(r.stdout.strip(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
