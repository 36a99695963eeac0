"""The daemon's memory under one agent's abuse of its broker (issue 9 §2).

Boots the test bed (needs root), installs the checkout, starts one agent in a
namespace sandbox, and from inside it runs what the bounds test runs
(tests/integration/test_broker_bounds.py): 8 threads of read_files over 300
files of 1 MiB, an edit_file of a 512 MiB sparse file, a 300,000-deep JSON
array, a 40 MiB request line, and 600 connections each holding half a
request. Prints the daemon's VmRSS before, at its peak and 3 s after.

    sudo /opt/leviath-dev/venv/bin/python bench/broker_bench.py [--threads 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from integration.test_broker_bounds import MB, abuse, prepare, start_agent, stop_agent  # noqa: E402
from testbed import Testbed  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(REPO)
        bed.add_standard_users()
        prepare(bed)
        agent = start_agent(bed)
        try:
            got = abuse(bed, agent, args.threads)
        finally:
            stop_agent(agent)
    start, peak, after = got["start"], got["peak"], got["after"]
    print(f"broker abuse, daemon VmRSS: before {start / MB:.1f} MB, "
          f"peak {peak / MB:.1f} MB (+{(peak - start) / MB:.1f}), "
          f"after {after / MB:.1f} MB (+{(after - start) / MB:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
