"""Issue 18's table, every row against its peer in the same run.

Boots the test bed (a real systemd, bus and polkit; needs root), installs the
checkout (or --repo DIR), starts leviathd and prints:

  start     `lev run -- true` (namespace) against `systemd-run --scope true`
            with the same limits, interleaved, both under the same
            `setpriv ... env` wrapper (the user's for lev, root's for
            systemd-run), whose few ms then cancel out of the ratio
  fence     kind namespace over kind none, the same command line (same run:
            alice's config asks for namespace, bob gets the machine's none)
  memory    PSS and processes of leviathd's own per-agent processes (all in
            an agent's scope but its command), for --agents sleeping agents
  starts    --concurrent `lev run --detach` at once from alice, bob, dave
  List      `lev ps` and a bare `busctl call ... List` with those agents
            running, against `busctl call ... GetId` (the bus floor)
  tool      `lev tool read_file F` from a shell inside an agent, against
            `cat F` and `python3 -c pass` there
  container kind container against namespace, attached, interleaved (left
            out with --no-container, or when the bed has no podman)

    sudo /opt/leviath-dev/venv/bin/python bench/table.py [--rounds 15]
        [--agents 20] [--concurrent 50] [--no-container] [--repo DIR]

The machine's load moves every figure: compare trees (--repo) in runs made
one after the other, several times, and read the ratios, not the times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from testbed import Testbed  # noqa: E402
from testbed.project import VENV  # noqa: E402

PY = f"{VENV}/bin/python"
INNER = "/usr/lib/leviathd-test/spawn_inner.py"
PROBE = "/usr/lib/leviathd-test/probe.py"
USERS = ("alice", "bob", "dave")
# The limits the daemon gives an agent's scope here (config below), so that
# systemd-run's scope carries the same properties.
LIMITS = {"MemoryMax": "512M", "TasksMax": "256"}
CONFIG = (
    '[sandbox]\nkind = "{kind}"\n{extra}\n[resources]\nmemory_max = "512M"\ntasks_max = 256\n'
)


def as_user(bed: Testbed, user: str, argv: list[str]) -> list[str]:
    u = bed.users[user]
    return ["setpriv", f"--reuid={u.uid}", f"--regid={u.gid}", "--init-groups",
            "--reset-env", "--", "env", f"HOME={u.home}", "PATH=/usr/bin:/bin", *argv]  # fmt: skip


def as_root(argv: list[str]) -> list[str]:
    """`argv` as root under the same wrapper as_user puts `lev` under
    (setpriv, env: ~4-5 ms here), so that it cancels out of a ratio of a
    `lev` row to its root peer (systemd-run)."""
    return ["setpriv", "--reuid=0", "--regid=0", "--init-groups", "--reset-env", "--",
            "env", "HOME=/root", "PATH=/usr/bin:/bin", *argv]  # fmt: skip


def configure(bed: Testbed, kind: str, extra: str = "", reload: bool = True) -> None:
    bed.write_file("/etc/leviath/config.toml", CONFIG.format(kind=kind, extra=extra))
    if reload:
        bed.run(["systemctl", "reload", "leviathd"])


def user_kind_namespace(bed: Testbed, user: str) -> None:
    folder = f"{bed.users[user].home}/.config/leviath"
    bed.run(["mkdir", "-p", folder], user=user)
    bed.run(f"cat > {folder}/config.toml", user=user, input='[sandbox]\nkind = "namespace"\n')


def interleaved(
    bed: Testbed, rounds: int, peers: dict[str, list[str]], pause_s: float = 0
) -> dict:
    inner = json.dumps({"rounds": rounds, "peers": peers, "pause_s": pause_s})
    r = bed.run([PY, INNER, inner], cwd="/home/alice/work", timeout=3600)
    return json.loads(r.stdout)


def probe(bed: Testbed, *args: str, timeout: int = 1800) -> dict:
    return json.loads(bed.run([PY, PROBE, *args], timeout=timeout).stdout)


def blueprint(bed: Testbed, name: str, kind: str, command: list[str]) -> str:
    folder = f"/home/alice/bp-{name}"
    bed.run(["mkdir", "-p", folder], user="alice")
    bed.run(f"cat > {folder}/blueprint.toml", user="alice", input=(
        f'[agent]\nname = "{name}"\ncommand = {json.dumps(command)}\n\n'
        f'[sandbox]\nkind = "{kind}"\n'
    ))  # fmt: skip
    return folder


def daemon_ms(bed: Testbed, kind: str, field: str) -> float:
    out = bed.run(["journalctl", "-o", "json", "--no-pager", "LEVIATH_EVENT=start",
                   f"LEVIATH_SANDBOX={kind}"]).stdout  # fmt: skip
    usec = [int(json.loads(ln).get(field, 0)) for ln in out.splitlines() if ln]
    return statistics.median(usec) / 1e3 if usec else float("nan")


def row(label: str, value: str, peer: str, ratio: str) -> None:
    print(f"| {label} | {value} | {peer} | {ratio} |")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--agents", type=int, default=20)
    ap.add_argument("--concurrent", type=int, default=50)
    ap.add_argument("--no-container", dest="container", action="store_false",
                    help="leave out the container row (it builds an image in the bed)")
    ap.add_argument("--repo", type=Path, default=REPO, help="the tree to install (default: this)")
    args = ap.parse_args()
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(args.repo)
        bed.add_standard_users()
        for name in ("spawn_inner.py", "probe.py"):
            bed.copy_in(HERE / name, f"/usr/lib/leviathd-test/{name}")
        for user in USERS:
            bed.run(["mkdir", "-p", f"{bed.users[user].home}/work"], user=user)
        bed.run("echo hello > /home/alice/work/f.txt", user="alice")
        configure(bed, "none", reload=False)
        # The same command line for both kinds: alice's own config asks for
        # the fence, bob has none (the machine's kind none applies to him).
        user_kind_namespace(bed, "alice")
        bed.start_service("leviathd")
        print("| row | leviathd | peer | ratio / difference |\n| --- | --- | --- | --- |")
        print("(systemd-run runs as root under the same `setpriv ... env` wrapper as `lev` "
              "runs as its user: the wrapper's cost cancels out of the start ratios)")

        lev = ["lev", "run", "--workdir", "/home/alice/work", "--", "true"]
        lev_bob = ["lev", "run", "--workdir", "/home/bob/work", "--", "true"]
        lev_ns = ["lev", "run", "--workdir", "/home/alice/work",
                  blueprint(bed, "true", "namespace", ["true"])]  # fmt: skip
        props = [a for k, v in LIMITS.items() for a in ("-p", f"{k}={v}")]
        r = interleaved(bed, args.rounds, {
            "systemd-run": as_root(["systemd-run", "--scope", "--quiet", *props, "true"]),
            "python3 -c pass": as_user(bed, "alice", [PY, "-c", "pass"]),
            "none": as_user(bed, "bob", lev_bob),
            "namespace": as_user(bed, "alice", lev),
            "none, --detach": as_user(bed, "bob", [*lev_bob[:2], "--detach", *lev_bob[2:]]),
            "lev ps --help": as_user(bed, "alice", ["lev", "ps", "--help"]),
        })  # fmt: skip
        floor, ns, none = (r[k]["median_ms"] for k in ("systemd-run", "namespace", "none"))
        row("`lev run -- true` (namespace) vs `systemd-run --scope true`",
            f"{ns:.0f} ms", f"{floor:.0f} ms", f"{ns / floor:.2f}x")  # fmt: skip
        row("  (kind none)", f"{none:.0f} ms", f"{floor:.0f} ms", f"{none / floor:.2f}x")
        for what in ("python3 -c pass", "lev ps --help", "none, --detach"):
            row(f"  ({what})", f"{r[what]['median_ms']:.0f} ms", "", "")
        row("fence overhead: namespace (alice) over none (bob)", f"{ns:.0f} ms", f"{none:.0f} ms",
            f"{ns - none:+.0f} ms")  # fmt: skip
        for kind in ("none", "namespace"):
            parts = [f"{what} {daemon_ms(bed, kind, field):.0f} ms" for what, field in (
                ("request->release", "LEVIATH_SPAWN_USEC"), ("polkit", "LEVIATH_POLKIT_USEC"),
                ("scope+job", "LEVIATH_SCOPE_USEC"))]  # fmt: skip
            row(f"  daemon's part, {kind} (median)", ", ".join(parts), "", "")

        configure(bed, "namespace")
        before = probe(bed, "daemon")["daemon_pss_kib"]
        got = probe(bed, "starts", str(args.agents), "sleep 600", "alice")
        units = [a["unit"] for a in json.loads(
            bed.run(["lev", "ps", "--json"], user="alice").stdout)]  # fmt: skip
        mem = probe(bed, "mem", *units)
        growth = (mem["daemon_pss_kib"] - before) / max(len(units), 1)
        row(f"per-agent own processes ({len(units)} agents)",
            f"{mem['own_pss_kib_per_agent'] / 1024:.1f} MB PSS "
            f"({mem.get('own_private_kib_per_agent', 0) / 1024:.1f} MB private), "
            f"{mem['own_procs_per_agent']:.1f} procs {mem['own_process_names']}",
            f"`sleep` itself {mem['payload_pss_kib_per_agent'] / 1024:.2f} MB", "")  # fmt: skip
        row("  PSS of one process, by name", str(mem["pss_kib_by_name"]) + " KiB", "", "")
        row("  daemon's own private memory growth per agent", f"{growth:.0f} KiB", "", "")
        if got["failed"]:
            print(f"  ({got['failed']} starts failed: {got['errors']})")

        conc = probe(bed, "starts", str(args.concurrent), "sleep 600", *USERS)
        row(f"{args.concurrent} concurrent `lev run --detach` (3 users)",
            f"{conc['wall_s']:.1f} s, {conc['failed']} failed", "", "")  # fmt: skip
        if conc["failed"]:
            print(f"  errors: {conc['errors']}")
        n_running = len(json.loads(bed.run(["lev", "ps", "--json"], user="dave").stdout))
        cost = probe(bed, "list", "alice", str(args.rounds))
        row(f"List with {n_running} agents: busctl List vs busctl GetId",
            f"{cost['busctl List']:.0f} ms", f"{cost['busctl GetId (bus floor)']:.0f} ms",
            f"{cost['busctl List'] - cost['busctl GetId (bus floor)']:+.0f} ms")  # fmt: skip
        row("  `lev ps` vs busctl List", f"{cost['lev ps']:.0f} ms",
            f"{cost['busctl List']:.0f} ms", f"{cost['lev ps'] / cost['busctl List']:.2f}x")
        stop = probe(bed, "stopall", *USERS)
        row("stop all", f"{stop['wall_s']:.1f} s for {stop['stopped']}",
            f"{stop['units_left_count']} scopes left after {stop['all_gone_s']:.1f} s", "")

        tool_inner = json.dumps({"rounds": args.rounds, "peers": {
            "lev tool": ["lev", "tool", "read_file", "f.txt"],
            "cat": ["cat", "f.txt"],
            "python3 -c pass": [PY, "-c", "pass"],
        }})  # fmt: skip
        out = bed.run(as_user(bed, "alice", [
            "lev", "run", "--workdir", "/home/alice/work", "--", PY, INNER, tool_inner,
        ]), cwd="/home/alice/work", timeout=1800).stdout  # fmt: skip
        t = json.loads(out.strip().splitlines()[-1])
        row("`lev tool read_file` inside an agent", f"{t['lev tool']['median_ms']:.0f} ms",
            f"cat {t['cat']['median_ms']:.0f} ms, python3 -c pass "
            f"{t['python3 -c pass']['median_ms']:.0f} ms",
            f"{t['lev tool']['median_ms'] / t['python3 -c pass']['median_ms']:.2f}x python")

        if args.container:
            from integration.test_container import BUILD_IMAGE, IMAGE

            built = bed.run(["sh", "-c", BUILD_IMAGE], timeout=600, check=False)
            if built.returncode != 0:
                print(f"(no container row: {built.stderr.strip()[-300:]})")
                return 0
            configure(bed, "namespace", f'image = "{IMAGE}"')
            lev_ct = ["lev", "run", "--workdir", "/home/alice/work",
                      blueprint(bed, "ct", "container", ["true"])]  # fmt: skip
            # A pause after each start: the container's teardown goes on
            # after its run returns and would slow the next start.
            c = interleaved(bed, args.rounds, {
                "namespace": as_user(bed, "alice", lev_ns),
                "container": as_user(bed, "alice", lev_ct),
            }, pause_s=1.5)
            cm, nm = c["container"]["median_ms"], c["namespace"]["median_ms"]
            row("container start vs namespace start", f"{cm:.0f} ms", f"{nm:.0f} ms",
                f"{cm / nm:.2f}x")
            parts = [f"{what} {daemon_ms(bed, 'container', field):.0f} ms" for what, field in (
                ("request->release", "LEVIATH_SPAWN_USEC"), ("scope+job", "LEVIATH_SCOPE_USEC"))]
            row("  daemon's part, container (median)", ", ".join(parts), "", "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
