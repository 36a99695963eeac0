"""Runs inside the test bed (see bench/spawn.py): times whole commands, each
the same number of times, interleaved so that drift hits every peer alike."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    spec = json.loads(sys.argv[1])
    rounds: int = spec["rounds"]
    peers: dict[str, list[str]] = spec["peers"]
    # Seconds to wait after each command: a container's teardown (the
    # engine's rm) goes on after its run returns and would slow the next.
    pause: float = spec.get("pause_s", 0)
    for argv in peers.values():  # warm caches once
        timed(argv)
    samples: dict[str, list[float]] = {name: [] for name in peers}
    for _ in range(rounds):
        for name, argv in peers.items():
            samples[name].append(timed(argv))
            time.sleep(pause)
    out = {
        name: {
            "median_ms": statistics.median(v) * 1e3,
            "p90_ms": sorted(v)[int(len(v) * 0.9) - 1] * 1e3,
            # On a loaded machine the low end is the closer to the unloaded cost.
            "p25_ms": sorted(v)[max(int(len(v) * 0.25) - 1, 0)] * 1e3,
        }
        for name, v in samples.items()
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
