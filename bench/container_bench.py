"""The container kind's costs, in one run in the test bed (issue 5).

Boots the test bed (a real systemd, bus and polkit; needs root), installs the
checkout, builds a busybox image from the host's static busybox (no
registry), and measures, interleaved:

  warm   `true` in the agent's warm container as the supervisor's worker
         runs it (container.run: the OCI runtime's exec), and through
         `podman exec` (the engine path, LEVIATH_CONTAINER_EXEC=engine)
  cold   `podman run --rm` of `true` with the very same container options
         (image, user, limits, mounts, init), i.e. what a container per
         command would cost

and prints their medians and the ratio (the issue's aim: warm at most half of
cold). Then, through the daemon as user alice, `lev run -- true` with
kind = "namespace" against kind = "container" (the whole client + daemon +
scope path, attached, so until `true` has exited), plus the daemon's own time
from request to release (journal field LEVIATH_SPAWN_USEC) per kind. Where the
daemon does not run the container kind, that part says so instead. Ratios
printed for issue 34: `lev run` of a container agent against the cold
`podman run --rm` above, and the warm exec against `podman exec`.

    sudo /opt/leviath-dev/venv/bin/python bench/container_bench.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from integration.test_container import BUILD_IMAGE, IMAGE  # noqa: E402
from testbed import Testbed  # noqa: E402
from testbed.project import VENV  # noqa: E402

INNER = "/root/leviath-container-bench.py"

# Runs as root inside the bed: one warm container in a real scope, then warm
# exec against cold run, interleaved.
INNER_SOURCE = r'''
import asyncio, dataclasses, json, pwd, subprocess, sys, time

from leviathd.config.load import parse_config
from leviathd.config.merge import resolve
from leviathd.config.models import SandboxKind
from leviathd.identity import user_info
from leviathd.sandbox import container, engine
from leviathd.sandbox.container import availability as c_availability, records as c_records
from leviathd.sandbox.container import settings as c_settings, worker as c_worker
from leviathd.sandbox.spec import RunRequest, build_spec_on_host

req = json.loads(sys.argv[1])
user = user_info(pwd.getpwnam("alice").pw_uid)
eff = resolve(parse_config(req["config"], "<bench>"), None, None, "bench").agent
eff = dataclasses.replace(eff, kind=SandboxKind.CONTAINER)
spec = build_spec_on_host(eff, user, RunRequest(("true",), "/home/alice/work"), req["agent_id"])


async def _ensure():
    from dbus_fast import BusType
    from dbus_fast.aio import MessageBus
    from leviathd.systemd.manager import SystemdManager
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    try:
        return await container.ensure(req["agent_id"], req["unit"], spec, eff,
                                      units=SystemdManager(bus))
    finally:
        bus.disconnect()

name = asyncio.run(_ensure())
spec = container.with_container(spec, name)
eng = c_availability._engine(str(eff.engine))
init = c_settings.init_binary()
options = c_settings.container_options(
    spec, eff, eng, ulimits=engine.current_ulimits(),
    network=engine.network_mode(spec.network), init=init,
)
rec = c_records._read_record(name)
engine_argv = c_worker.exec_argv(name, spec, eng)
cold_argv = [*eng.base(), "run", "--rm", *options, eff.image, "--", "true"]
out = {"runtime": [], "engine": [], "cold": []}
import os
for _ in range(req["rounds"]):
    for kind in out:
        fds = ()
        t = time.perf_counter()
        if kind == "runtime":  # what container.run execs, argv built each time as it does
            argv, fd = c_worker.runtime_exec(rec, spec)
            fds, env = (fd,), dict(engine.ENGINE_ENV)
        elif kind == "engine":
            argv, env = engine_argv, c_worker.exec_env(spec)
        else:
            argv, env = cold_argv, dict(engine.ENGINE_ENV)
        r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           pass_fds=fds)
        out[kind].append(time.perf_counter() - t)
        for fd in fds:
            os.close(fd)
        if r.returncode != 0:
            raise SystemExit(f"{argv[:4]}... exited {r.returncode}: {r.stderr.decode()}")
asyncio.run(container.teardown(req["agent_id"]))
print(json.dumps(out))
'''


def config(kind: str) -> str:
    return (f'[sandbox]\nkind = "{kind}"\nimage = "{IMAGE}"\nnetwork = false\n'
            '[resources]\nmemory_max = "256M"\ntasks_max = 64\n')  # fmt: skip


def ms(values: list[float]) -> str:
    p90 = sorted(values)[max(0, int(len(values) * 0.9) - 1)]
    return f"{statistics.median(values) * 1000:7.1f} ms (p90 {p90 * 1000:.1f})"


def exec_vs_run(bed: Testbed, rounds: int) -> dict[str, float]:
    agent_id, unit = "be0c0001", "leviath-alice-bench-be0c0001.scope"
    holder = bed.command(["systemd-run", "--scope", "--quiet", f"--unit={unit}",
                          "--slice=leviath.slice", "-p", "Delegate=yes",
                          "sleep", "infinity"])  # fmt: skip
    proc = subprocess.Popen(holder, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(1)
        arg = json.dumps({"config": config("container"), "agent_id": agent_id, "unit": unit,
                          "rounds": rounds})  # fmt: skip
        r = bed.run([f"{VENV}/bin/python", INNER, arg], timeout=1800)
        data = json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        bed.run(["systemctl", "stop", unit], check=False)
        proc.wait(timeout=30)
    warm, engine, cold = data["runtime"], data["engine"], data["cold"]
    print(f"per command `true`, {rounds} rounds interleaved (podman, runc, busybox image):")
    print(f"  warm  runtime exec into the agent's container (container.run)  {ms(warm)}")
    print(f"  warm  podman exec into it (LEVIATH_CONTAINER_EXEC=engine)     {ms(engine)}")
    print(f"  cold  podman run --rm, same options                           {ms(cold)}")
    ratio = statistics.median(warm) / statistics.median(cold)
    ratio_engine = statistics.median(engine) / statistics.median(cold)
    print(f"  warm / cold = {ratio:.2f} (podman exec: {ratio_engine:.2f})  (aim: <= 0.50)")
    print(f"  warm exec / podman exec = {statistics.median(warm) / statistics.median(engine):.2f}"
          "  (issue 34's aim: <= 1.2)")
    return {"cold": statistics.median(cold), "engine": statistics.median(engine)}


def lev_start(bed: Testbed, rounds: int, peers: dict[str, float]) -> None:
    lev = ["lev", "run", "--workdir", "/home/alice/work", "--", "true"]
    results: dict[str, list[float]] = {}
    for kind in ("namespace", "container"):
        bed.write_file("/etc/leviath/config.toml", config(kind))
        bed.run(["systemctl", "reload", "leviathd"])
        time.sleep(0.5)
        first = bed.run(lev, user="alice", check=False)
        if first.returncode != 0:
            print(f"  lev run with kind = {kind}: not measured: {first.stderr.strip()}")
            continue
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            bed.run(lev, user="alice")
            times.append(time.perf_counter() - t)
        results[kind] = times
    print(f"agent start to exit of `true`, `lev run` as alice, {rounds} runs each:")
    for kind, times in results.items():
        print(f"  kind = {kind:9}  {ms(times)}")
    if len(results) == 2:
        ratio = statistics.median(results["container"]) / statistics.median(results["namespace"])
        print(f"  container / namespace = {ratio:.2f}")
    if "container" in results:
        # The same command in the same image with the same options, by podman
        # itself (exec_vs_run's cold row, earlier in this run).
        print(f"  lev run (container) / podman run --rm = "
              f"{statistics.median(results['container']) / peers['cold']:.2f}"
              "  (issue 34's aim: <= 1.3)")
    for kind in results:
        out = bed.run(["journalctl", "-o", "json", "--no-pager", "LEVIATH_EVENT=start",
                       f"LEVIATH_SANDBOX={kind}"]).stdout  # fmt: skip
        usec = [int(json.loads(ln).get("LEVIATH_SPAWN_USEC", 0)) for ln in out.splitlines() if ln]
        if usec:
            print(f"  daemon request-to-release, {kind:9}: median "
                  f"{statistics.median(usec) / 1000:.1f} ms over {len(usec)} starts")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    with Testbed() as bed:
        bed.wait_running()
        bed.install_project(REPO)
        bed.add_standard_users()
        r = bed.run(BUILD_IMAGE, check=False, timeout=300)
        if r.returncode != 0:
            print(f"cannot build the image in the bed: {r.stderr.strip()}")
            return 1
        bed.write_file(INNER, INNER_SOURCE, mode=0o700)
        bed.run(["mkdir", "-p", "/home/alice/work"], user="alice")
        bed.write_file("/etc/leviath/config.toml", config("namespace"))
        bed.start_service("leviathd")
        peers = exec_vs_run(bed, args.rounds)
        lev_start(bed, args.rounds, peers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
