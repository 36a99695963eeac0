"""Spawn latency of an agent, against its peers, in one run (issues 3 and 4).

Boots the test bed (a real systemd, bus and polkit; needs root), installs the
checkout, starts leviathd, and times, interleaved, as user alice where a user
is involved:

  systemd-run --scope true        the floor: a transient scope, nothing else
  setpriv ... true                what running a command as alice costs here
  lev run -- true  (kind none)    the whole client + daemon + scope path
  lev run -- true  (namespace)    the same with the namespace fence
  bwrap ... true                  bubblewrap with flags equivalent to the fence
                                  (unshare every namespace but user, die-with-parent,
                                  new-session, ro system, tmpfs home and /tmp)

and prints medians and the ratios the issues ask for, plus the daemon's own
time from request to release (journal field LEVIATH_SPAWN_USEC).

    sudo /opt/leviath-dev/venv/bin/python bench/spawn.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from testbed import Testbed  # noqa: E402

BWRAP = [
    "bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
    "--unshare-cgroup-try", "--die-with-parent", "--new-session",
    "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
    "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
    "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
    "--proc", "/proc", "--dev", "/dev",
    "--tmpfs", "/tmp", "--tmpfs", "/home/alice",
    "--bind", "/home/alice/work", "/home/alice/work", "--chdir", "/home/alice/work",
    "true",
]  # fmt: skip


def as_alice(bed: Testbed, argv: list[str]) -> list[str]:
    alice = bed.users["alice"]
    return ["setpriv", f"--reuid={alice.uid}", f"--regid={alice.gid}", "--init-groups",
            "--reset-env", "--", "env", f"HOME={alice.home}", *argv]  # fmt: skip


def spawn_usec(bed: Testbed, sandbox: str, field: str = "LEVIATH_SPAWN_USEC") -> list[int]:
    out = bed.run(["journalctl", "-o", "json", "--no-pager", "LEVIATH_EVENT=start",
                   f"LEVIATH_SANDBOX={sandbox}"]).stdout  # fmt: skip
    return [int(json.loads(line)[field]) for line in out.splitlines() if line]


def measure(bed: Testbed, kind: str, rounds: int, peers: dict[str, list[str]]) -> dict:
    bed.write_file("/etc/leviath/config.toml", f'[sandbox]\nkind = "{kind}"\n')
    bed.run(["systemctl", "reload", "leviathd"])
    inner = json.dumps({"rounds": rounds, "peers": peers})
    r = bed.run(["/opt/leviath-dev/venv/bin/python", "/usr/lib/leviathd-test/spawn_inner.py",
                 inner], cwd="/home/alice/work", timeout=1800)  # fmt: skip
    return json.loads(r.stdout)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(REPO)
        bed.add_standard_users()
        bed.copy_in(REPO / "bench" / "spawn_inner.py", "/usr/lib/leviathd-test/spawn_inner.py")
        bed.run(["mkdir", "-p", "/home/alice/work"], user="alice")
        bed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "none"\n')
        bed.start_service("leviathd")
        lev = ["lev", "run", "--workdir", "/home/alice/work", "--", "true"]
        base = {
            "systemd-run --scope": ["systemd-run", "--scope", "--quiet", "true"],
            "setpriv (as alice)": as_alice(bed, ["true"]),
            # As root, without a user namespace, like our fence: in the bed an
            # unprivileged bwrap cannot mount /proc (the bed's /proc/sys is a
            # read-only overmount, which the kernel treats as too revealing).
            "bwrap (root, all but user ns)": BWRAP,
        }
        # The machine says kind = "none"; a blueprint may only tighten it, to
        # the fence. So both kinds run interleaved in one measurement.
        bed.run(["mkdir", "-p", "/home/alice/bp-ns"], user="alice")
        bed.run("cat > /home/alice/bp-ns/blueprint.toml", user="alice", input=(
            '[agent]\nname = "true"\ncommand = ["true"]\n\n[sandbox]\nkind = "namespace"\n'
        ))
        lev_ns = ["lev", "run", "--workdir", "/home/alice/work", "/home/alice/bp-ns"]
        results = measure(bed, "none", args.rounds, {
            **base,
            "lev run (none)": as_alice(bed, lev),
            "lev run (namespace)": as_alice(bed, lev_ns),
        })
        width = max(len(k) for k in results)
        print(f"{'command':<{width}}  median ms   p90 ms   ({args.rounds} rounds, interleaved)")
        for name, r in results.items():
            print(f"{name:<{width}}  {r['median_ms']:9.1f} {r['p90_ms']:8.1f}")
        floor = results["systemd-run --scope"]["median_ms"]
        none_ms = results["lev run (none)"]["median_ms"]
        ns_ms = results["lev run (namespace)"]["median_ms"]
        bwrap = results["bwrap (root, all but user ns)"]["median_ms"]
        print()
        print(f"lev run (none) / systemd-run --scope      = {none_ms / floor:.2f}x  (aim <= 2x)")
        print(f"lev run (namespace) / systemd-run --scope = {ns_ms / floor:.2f}x")
        print(f"lev run (namespace) / bwrap               = {ns_ms / bwrap:.2f}x")
        print(f"namespace fence adds {ns_ms - none_ms:+.1f} ms over kind none  (aim < 15 ms)")
        for kind in ("none", "namespace"):
            parts = {
                "request->release": spawn_usec(bed, kind),
                "of which polkit": spawn_usec(bed, kind, "LEVIATH_POLKIT_USEC"),
                "of which StartTransientUnit+job": spawn_usec(bed, kind, "LEVIATH_SCOPE_USEC"),
            }
            for what, usec in parts.items():
                if usec:
                    median = statistics.median(usec) / 1e3
                    print(f"daemon {what}, {kind}: median {median:.1f} ms over {len(usec)} runs")
        client = measure(bed, "none", args.rounds, {
            "python3 -c pass": ["/opt/leviath-dev/venv/bin/python", "-c", "pass"],
            "lev --help (imports only)": ["lev", "ps", "--help"],
        })
        for name, r in client.items():
            print(f"client start-up, {name}: median {r['median_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
