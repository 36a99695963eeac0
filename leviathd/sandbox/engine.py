"""Which container engine, OCI runtime, ulimits and network mode the container
kind uses on this host: read from the environment of the daemon (the admin's
knobs, see docs/containers.md) and detected, never assumed.

- Engine: `[sandbox] engine` from the machine or user config (a blueprint's is
  discarded by the merge); `auto` takes podman, then docker.
- Runtime (podman only): LEVIATH_CONTAINER_RUNTIME if set; otherwise podman's
  own default (containers.conf) unless that is crun and the host mounts cgroups
  in hybrid mode, which crun refuses: then runc, when installed.
- Ulimits: the engines raise RLIMIT_NOFILE/NPROC for a container by default,
  which a host that forbids raising hard limits refuses. We always pass explicit
  values at or below the hard limits this process has, read when the container
  starts; LEVIATH_CONTAINER_ULIMITS ("nofile=1024:1024,nproc=4096:4096") may ask
  for lower ones.
- Network for `network = true`: LEVIATH_CONTAINER_NETWORK (an engine network
  mode such as "bridge", "slirp4netns", "pasta"), default "host", the same
  network the namespace kind gives; `network = false` is always "none".
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from dataclasses import dataclass

RUNTIME_ENV = "LEVIATH_CONTAINER_RUNTIME"
ULIMITS_ENV = "LEVIATH_CONTAINER_ULIMITS"
NETWORK_ENV = "LEVIATH_CONTAINER_NETWORK"

# The environment every engine command runs with: nothing of the daemon's
# (NOTIFY_SOCKET above all: rootful podman reports READY=1 to any socket it
# finds) and nothing of an agent's.
ENGINE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENGINE_ENV: dict[str, str] = {"PATH": ENGINE_PATH, "HOME": "/root", "LANG": "C.UTF-8"}

_ULIMIT_RESOURCES = {"nofile": resource.RLIMIT_NOFILE, "nproc": resource.RLIMIT_NPROC}
# What the engines would ask for when left alone (podman and docker: 2^20).
_ENGINE_DEFAULT_ULIMIT = 1 << 20


class EngineUnavailable(Exception):
    """Why the engine cannot be used here (a sentence for `probe`)."""


# The engine found on this host (binary, runtime); `domain.Engine` is the
# kind the configuration asks for.
@dataclass(frozen=True)
class DetectedEngine:
    name: str  # "podman" | "docker"
    path: str
    runtime: str | None  # podman's --runtime, None for the default / docker
    # podman's configured runtime (`podman info`), which runs containers when
    # `runtime` is None: where its state is read (container._runtime_state).
    default_runtime: str = ""

    def base(self) -> list[str]:
        """The engine's argv prefix with the global options every command needs."""
        argv = [self.path]
        if self.name == "podman":
            # cgroupfs: the container's cgroup is a plain folder below the
            # agent's scope (--cgroup-parent), which systemd cannot express as
            # a unit of its own (scopes have no children units).
            argv += ["--cgroup-manager", "cgroupfs", "--log-level", "error"]
            # Its events would be journald entries of the agent's scope,
            # interleaved with the agent's output; the daemon records its own.
            argv += ["--events-backend", "none"]
            if self.runtime:
                argv += ["--runtime", self.runtime]
        return argv


def _run(argv: list[str], timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=ENGINE_ENV,
        stdin=subprocess.DEVNULL, check=False,
    )


def find_binary(name: str) -> str | None:
    return shutil.which(name, path=ENGINE_PATH)


def cgroup_mode(mountinfo: str | None = None) -> str:
    """ "v2" (unified only), "hybrid" (v1 controllers plus a cgroup2 mount), or
    "v1" (legacy), from the mount table."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo") as f:
                mountinfo = f.read()
        except OSError:
            return "v1"
    v1 = v2 = False
    for line in mountinfo.splitlines():
        _, sep, after = line.partition(" - ")
        if not sep:
            continue
        fstype = after.split(" ", 1)[0]
        if fstype == "cgroup":
            v1 = True
        elif fstype == "cgroup2":
            v2 = True
    if v1 and v2:
        return "hybrid"
    return "v2" if v2 else "v1"


def choose_runtime(
    default: str, mode: str, override: str | None, have: set[str]
) -> tuple[str | None, str | None]:
    """(runtime to pass or None for the engine's default, reason it cannot run).

    Pure: `default` is podman's configured runtime, `mode` the cgroup mode,
    `override` LEVIATH_CONTAINER_RUNTIME, `have` the runtimes installed."""
    if override:
        return override, None
    if os.path.basename(default) == "crun" and mode == "hybrid":
        if "runc" in have:
            return "runc", None
        return None, "crun refuses hybrid cgroups and runc is not installed"
    return None, None


def detect(configured: str) -> DetectedEngine:
    """The engine for `configured` ("auto", "podman", "docker"), checked to
    answer. Raises EngineUnavailable with the reason."""
    names = ["podman", "docker"] if configured == "auto" else [configured]
    found = [(n, p) for n in names if (p := find_binary(n)) is not None]
    if not found:
        raise EngineUnavailable(f"no container engine ({' or '.join(names)}) on PATH")
    errors = []
    for name, path in found:
        try:
            return _check(name, path)
        except EngineUnavailable as exc:
            errors.append(str(exc))
    raise EngineUnavailable("; ".join(errors))


def _check(name: str, path: str) -> DetectedEngine:
    if name == "podman":
        r = _run([path, "info", "--format", "{{.Host.OCIRuntime.Name}}"])
        if r.returncode != 0:
            raise EngineUnavailable(f"podman info failed: {_last_line(r.stderr)}")
        have = {n for n in ("runc", "crun") if find_binary(n) is not None}
        runtime, why = choose_runtime(
            r.stdout.strip(), cgroup_mode(), os.environ.get(RUNTIME_ENV) or None, have
        )
        if why:
            raise EngineUnavailable(f"podman: {why}")
        return DetectedEngine("podman", path, runtime, default_runtime=r.stdout.strip())
    r = _run([path, "info", "--format", "{{.CgroupDriver}}"])
    if r.returncode != 0:
        raise EngineUnavailable(f"docker info failed: {_last_line(r.stderr)}")
    if r.stdout.strip() != "cgroupfs":
        # With the systemd driver dockerd can only put a container in a slice,
        # never below the agent's scope, so systemd would not count it.
        raise EngineUnavailable(
            f"docker uses the {r.stdout.strip() or 'unknown'} cgroup driver; only cgroupfs "
            "lets a container sit below the agent's scope"
        )
    return DetectedEngine("docker", path, None)


def image_present(engine: DetectedEngine, image: str) -> bool:
    if engine.name == "podman":
        return _run([*engine.base(), "image", "exists", image]).returncode == 0
    return _run([engine.path, "image", "inspect", image]).returncode == 0


def parse_ulimits(text: str) -> dict[str, tuple[int, int]]:
    """ "nofile=1024:1024,nproc=100" -> {"nofile": (1024, 1024), "nproc": (100, 100)}."""
    out: dict[str, tuple[int, int]] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or name not in _ULIMIT_RESOURCES:
            raise ValueError(f"{ULIMITS_ENV}: {item!r} is not nofile=SOFT:HARD or nproc=SOFT:HARD")
        soft_s, _, hard_s = value.partition(":")
        soft = int(soft_s)
        hard = int(hard_s) if hard_s else soft
        if soft < 0 or hard < soft:
            raise ValueError(f"{ULIMITS_ENV}: {item!r}: need 0 <= soft <= hard")
        out[name] = (soft, hard)
    return out


def ulimits(
    hard_limits: dict[str, int], wanted: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    """Explicit ulimits at or below the hard limits. Pure: `hard_limits` are
    this process's (RLIM_INFINITY as -1), `wanted` the admin's."""
    out: dict[str, tuple[int, int]] = {}
    for name in _ULIMIT_RESOURCES:
        hard = hard_limits[name]
        cap = _ENGINE_DEFAULT_ULIMIT if hard < 0 else hard
        soft_w, hard_w = wanted.get(name, (cap, cap))
        h = min(hard_w, cap)
        out[name] = (min(soft_w, h), h)
    return out


def current_ulimits() -> dict[str, tuple[int, int]]:
    hard = {}
    for name, res in _ULIMIT_RESOURCES.items():
        limit = resource.getrlimit(res)[1]
        hard[name] = -1 if limit == resource.RLIM_INFINITY else limit
    return ulimits(hard, parse_ulimits(os.environ.get(ULIMITS_ENV, "")))


def network_mode(network: bool) -> str:
    if not network:
        return "none"
    return os.environ.get(NETWORK_ENV) or "host"


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"
