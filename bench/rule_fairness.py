"""Bob's calls while alice's agent floods tool calls under her largest rule
set (issue 31 §4), in the test bed.

Boots the test bed (needs root), installs the checkout, lays out alice's
rules (256 in her config, 256 in her blueprint, each just under its own
step budget: tests/integration/rule_flood.py) and prints bob's `List` bus
call (the daemon's part of `lev ps`, from one connection) and his whole
`lev ps`: idle, while alice's agent sends the same read_file calls on four
connections without any rule (the peer: what the flood itself costs a
shared 2-core machine), and with her largest rule set; then the ratios of
the medians against idle and against the peer (aim: within 2x idle).

    sudo /opt/leviath-dev/venv/bin/python bench/rule_fairness.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integration"), str(REPO)]

from integration.test_container import PROBE, PY  # noqa: E402
from rule_flood import Flood, lay_out_flood, restore  # noqa: E402
from testbed import Testbed  # noqa: E402


def bob_list(bed: Testbed, rounds: int) -> list[float]:
    bed.write_file("/tmp/leviath-probe.py", PROBE, mode=0o755)
    r = bed.run([PY, "/tmp/leviath-probe.py", str(rounds)], user="bob", timeout=300)
    return [float(x) for x in json.loads(r.stdout)]


def bob_ps(bed: Testbed, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.monotonic()
        bed.run(["lev", "ps"], user="bob", timeout=120)
        out.append(time.monotonic() - t0)
    return out


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.1f} ms, max {max(values) * 1000:.1f} ms"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(REPO)
        bed.add_standard_users()
        bed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
        old = lay_out_flood(bed, with_rules=False)
        bed.start_service("leviathd")
        idle_list, idle_ps = bob_list(bed, args.rounds), bob_ps(bed, 5)
        rows = []
        for label, with_rules in (("alice flooding, no rules", False),
                                  ("alice flooding, 512 rules", True)):
            restore(bed, old)
            lay_out_flood(bed, with_rules=with_rules)
            with Flood(bed) as flood:
                t0 = time.monotonic()
                busy_list, busy_ps = bob_list(bed, args.rounds), bob_ps(bed, 5)
                seconds = time.monotonic() - t0
            rows.append((label, busy_list, busy_ps, flood.count / seconds if seconds else 0.0))
        med = statistics.median
        print(f"bob's calls, {args.rounds} List and 5 lev ps each (namespace kind, shared CPUs):")
        print(f"  {'idle':28} List {ms(idle_list)}; lev ps {ms(idle_ps)}")
        for label, busy_list, busy_ps, rate in rows:
            print(f"  {label:28} List {ms(busy_list)}; lev ps {ms(busy_ps)}"
                  f"  (alice: ~{rate:.0f} replies/s)")
        (_, peer_list, peer_ps, _), (_, ruled_list, ruled_ps, _) = rows
        print(f"  512 rules / idle: List {med(ruled_list) / med(idle_list):.2f}x, lev ps "
              f"{med(ruled_ps) / med(idle_ps):.2f}x; 512 rules / no rules: List "
              f"{med(ruled_list) / med(peer_list):.2f}x, lev ps "
              f"{med(ruled_ps) / med(peer_ps):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
