"""The filtered engine socket's cost, with the docker CLI (issue 13).

Boots the test bed (needs root), installs the checkout, imports the busybox
image the integration tests use, turns `[sandbox.containers]` on, installs
Debian's docker CLI (unpacked by scripts/setup into /opt/leviath-dev/docker),
and times, in the same run and interleaved round by round:

  direct    the docker CLI as root on podman's own socket (the daemon's API
            service, /run/leviath/engine/podman.sock)
  filtered  the same commands inside an agent of alice's, on its filtered
            socket (DOCKER_HOST=unix:///run/leviath/engine.sock)

for `docker ps` and `docker run --rm IMAGE true` (whole CLI invocations, as
an agent pays them), and prints the medians and the ratios (the issue's aim:
filtered at most 1.2x direct). `docker --version` (no request at all) shows
what starting the CLI costs on each side, inside the sandbox and out; the
API rows time one raw request each (HEAD /_ping, GET /containers/json), the
filter's own cost per request.

    sudo /opt/leviath-dev/venv/bin/python bench/engine_socket_bench.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integration"), str(REPO)]

from test_engine_socket import BUILD_IMAGE, CONFIG, IMAGE  # noqa: E402
from testbed import Testbed  # noqa: E402

DOCKER_DIR = os.environ.get("LEVIATH_DOCKER_DIR", "/opt/leviath-dev/docker")
DIRECT = "unix:///run/leviath/engine/podman.sock"
BED_RUN = ["--runtime", "runc", "--network", "none", "--ulimit", "nofile=1024:1024",
           "--ulimit", "nproc=1000:1000"]

# Runs each command n times; prints {"name": [ms...], ...}. api-*: one raw
# request on a fresh connection (what the filter adds per request, without
# the CLI's own start, which is most of a `docker ps` and noisy here).
TIMER = r'''
import json, os, socket, subprocess, sys, time
n, image, bed_run = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
path = os.environ["DOCKER_HOST"].removeprefix("unix://")
def api(raw):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(raw)
    while s.recv(65536):
        pass
    s.close()
head = "HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n"
calls = {
    "nop": lambda: subprocess.run(["/usr/bin/docker", "--version"], stdout=subprocess.DEVNULL),
    "ps": lambda: subprocess.run(["/usr/bin/docker", "ps"], check=True,
                                 stdout=subprocess.DEVNULL),
    "run": lambda: subprocess.run(["/usr/bin/docker", "run", "--rm", *bed_run, image, "true"],
                                  check=True, stdout=subprocess.DEVNULL),
    "api-ping": lambda: api(f"HEAD /_ping {head}".encode()),
    "api-ps": lambda: api(f"GET /v1.41/containers/json {head}".encode()),
}
if len(sys.argv) > 4:  # a small build context: one RUN step, no cache
    calls["build"] = lambda: subprocess.run(
        ["/usr/bin/docker", "build", "-q", "--no-cache", "--network", "none", sys.argv[4]],
        check=True, stdout=subprocess.DEVNULL, env={**os.environ, "DOCKER_BUILDKIT": "0"})
out = {k: [] for k in calls}
for i in range(n):
    for k, call in calls.items():
        t0 = time.perf_counter()
        call()
        out[k].append((time.perf_counter() - t0) * 1000)
print(json.dumps(out))
'''
ROWS = (("nop", "docker --version (no API)"), ("ps", "docker ps"),
        ("run", "docker run --rm IMAGE true"), ("api-ping", "API: HEAD /_ping"),
        ("api-ps", "API: GET /containers/json"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10,
                    help="rounds (each: direct, then filtered)")
    ap.add_argument("--per-round", type=int, default=3, help="invocations of each command")
    args = ap.parse_args()
    if not os.access(f"{DOCKER_DIR}/bin/docker", os.X_OK):
        print(f"no docker CLI in {DOCKER_DIR}: run scripts/setup", file=sys.stderr)
        return 2
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(REPO)
        bed.add_standard_users()
        r = bed.run(BUILD_IMAGE, check=False, timeout=180)
        if r.returncode != 0:
            print(f"no image: {r.stderr.strip()}", file=sys.stderr)
            return 2
        bed.write_file("/etc/leviath/config.toml", CONFIG)
        bed.run(["systemctl", "restart", "leviathd"])
        bed.run(["install", "-D", "-m", "0755", f"{DOCKER_DIR}/bin/docker", "/usr/bin/docker"])
        home = bed.users["alice"].home
        bed.run(["mkdir", "-p", "bench"], user="alice")
        bed.write_file(f"{home}/bench/timer.py", TIMER)
        timer = ["python3", f"{home}/bench/timer.py", str(args.per_round), IMAGE,
                 json.dumps(BED_RUN)]
        # One agent first, so that the daemon's podman service is running.
        bed.run(["lev", "run", "--", "/usr/bin/docker", "ps"], user="alice",
                cwd=f"{home}/bench", timeout=120)
        direct: dict[str, list[float]] = {k: [] for k, _ in ROWS}
        filtered: dict[str, list[float]] = {k: [] for k, _ in ROWS}
        for _ in range(args.rounds):
            d = bed.run(timer, env={"DOCKER_HOST": DIRECT}, timeout=600).stdout
            f = bed.run(["lev", "run", "--", *timer], user="alice", cwd=f"{home}/bench",
                        timeout=600).stdout
            for into, text in ((direct, d), (filtered, f)):
                got = json.loads(text.strip().splitlines()[-1])
                for k in into:
                    into[k] += got[k]
    n = args.rounds * args.per_round
    print(f"docker CLI {n} times each, {args.rounds} rounds interleaved (podman 4.3 service):")
    for k, label in ROWS:
        dm, fm = statistics.median(direct[k]), statistics.median(filtered[k])
        aim = "  (aim <= 1.20)" if k in ("ps", "run") else ""
        print(f"  {label:<28} direct {dm:7.2f} ms   filtered {fm:7.2f} ms   "
              f"ratio {fm / dm:.2f}{aim}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
