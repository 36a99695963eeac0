"""An agent's engine socket on its user's own rootless podman (issue 29),
against the same rootless podman used directly by the user, same run.

Boots the test bed (needs root), installs the checkout, turns
`[sandbox.containers]` on (the default engine: the agent's user's rootless
podman, one service per agent), installs Debian's docker CLI (unpacked by
scripts/setup into /opt/leviath-dev/docker), and times, interleaved round by
round:

  direct    the docker CLI as alice, outside any agent, on her own
            `podman system service` (rootless, her own storage)
  agent     the same commands inside an agent of alice's, on its filtered
            socket (DOCKER_HOST=unix:///run/leviath/engine.sock), whose
            engine is the rootless podman the daemon started for that agent

for `docker ps`, `docker run --rm IMAGE true` and `docker build` (legacy
builder, no cache) of a small context whose one RUN step runs `true` (whole
CLI invocations),
plus one raw request each (HEAD /_ping, GET /containers/json). Each side
imports the busybox image first (untimed: an agent's storage starts empty).
Prints medians and ratios (the issue's aim: at most 1.3x).

    sudo /opt/leviath-dev/venv/bin/python bench/rootless_engine_bench.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integration"), str(REPO),
                str(REPO / "bench")]

from engine_socket_bench import ROWS, TIMER  # noqa: E402
from test_engine_rootless import CONFIG, IMAGE, MAKE_TARBALL  # noqa: E402
from testbed import Testbed  # noqa: E402

DOCKER_DIR = os.environ.get("LEVIATH_DOCKER_DIR", "/opt/leviath-dev/docker")
BED_RUN = ["--runtime", "runc", "--network", "none", "--ulimit", "nofile=1024:1024",
           "--ulimit", "nproc=1000:1000"]
# alice's own service, outside any agent, on her own storage.
ROWS_BUILD = (*ROWS, ("build", "docker build (RUN true)"))
OWN_SERVICE = ("mkdir -p -m 700 $HOME/bench/xdg && XDG_RUNTIME_DIR=$HOME/bench/xdg "
               "exec podman --cgroup-manager cgroupfs system service --time=0 "
               "unix://$HOME/bench/direct.sock")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10, help="rounds (each: direct, then agent)")
    ap.add_argument("--per-round", type=int, default=3, help="invocations of each command")
    args = ap.parse_args()
    if not os.access(f"{DOCKER_DIR}/bin/docker", os.X_OK):
        print(f"no docker CLI in {DOCKER_DIR}: run scripts/setup", file=sys.stderr)
        return 2
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(REPO)
        bed.add_standard_users()
        home = bed.users["alice"].home
        bed.run(["mkdir", "-p", "bench"], user="alice")
        r = bed.run(["sh", "-c", MAKE_TARBALL, "sh", f"{home}/bench/bb.tar"], check=False,
                    timeout=180)
        if r.returncode != 0:
            print(f"no image: {r.stderr.strip()}", file=sys.stderr)
            return 2
        bed.write_file(f"{home}/bench/timer.py", TIMER)
        bed.write_file(f"{home}/bench/ctx/Dockerfile", f"FROM {IMAGE}\nRUN true\n")
        bed.run(["chown", "-R", "alice:", f"{home}/bench"])
        bed.write_file("/etc/leviath/config.toml", CONFIG)
        bed.run(["systemctl", "restart", "leviathd"])
        bed.run(["install", "-D", "-m", "0755", f"{DOCKER_DIR}/bin/docker", "/usr/bin/docker"])
        # As the daemon starts an agent's (enginesock/rootless_exec.py): a fresh /proc in
        # a mount namespace of its own (the bed's /proc/sys is covered, and a rootless
        # container's proc mount needs a fully visible one), then alice for good.
        bed.run(["systemd-run", "--quiet", "--unit=leviath-bench-own-podman", "unshare",
                 "--mount", "--propagation", "private", "sh", "-c",
                 'mount -t proc proc /proc && exec setpriv --reuid alice --regid alice '
                 f'--init-groups env HOME={home} PATH=/usr/bin:/bin sh -c "$0"', OWN_SERVICE])
        direct_host = f"unix://{home}/bench/direct.sock"
        timer = ["python3", f"{home}/bench/timer.py", str(args.per_round), IMAGE,
                 json.dumps(BED_RUN), f"{home}/bench/ctx"]
        prepare = f"/usr/bin/docker import {home}/bench/bb.tar {IMAGE} >/dev/null && "
        bed.run(["sh", "-c", f"for i in $(seq 100); do [ -S {home}/bench/direct.sock ] && "
                 "exit 0; sleep 0.1; done; exit 1"], timeout=30)
        bed.run(["sh", "-c", prepare + "true"], user="alice", env={"DOCKER_HOST": direct_host},
                timeout=120)
        direct: dict[str, list[float]] = {k: [] for k, _ in ROWS_BUILD}
        agent: dict[str, list[float]] = {k: [] for k, _ in ROWS_BUILD}
        try:
            for _ in range(args.rounds):
                d = bed.run(timer, user="alice", env={"DOCKER_HOST": direct_host},
                            timeout=600).stdout
                a = bed.run(["lev", "run", "--", "sh", "-c", prepare + 'exec "$@"', "sh",
                             *timer], user="alice", cwd=f"{home}/bench", timeout=600).stdout
                for into, text in ((direct, d), (agent, a)):
                    got = json.loads(text.strip().splitlines()[-1])
                    for k in into:
                        into[k] += got[k]
        finally:
            bed.run(["systemctl", "stop", "leviath-bench-own-podman"], check=False)
    n = args.rounds * args.per_round
    print(f"docker CLI {n} times each, {args.rounds} rounds interleaved (rootless podman 4.3, "
          "alice's own service vs her agent's):")
    for k, label in ROWS_BUILD:
        dm, am = statistics.median(direct[k]), statistics.median(agent[k])
        aim = "  (aim <= 1.30)" if k in ("ps", "run", "build") else ""
        print(f"  {label:<28} direct {dm:7.2f} ms   agent {am:7.2f} ms   "
              f"ratio {am / dm:.2f}{aim}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
