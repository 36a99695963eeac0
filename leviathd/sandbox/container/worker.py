"""The worker side (the supervisor's worker, root, in the agent's scope, stdio
connected): a command run in the warm container, through the runtime or
`podman exec`, so the agent's stdio and exit status flow through."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Mapping
from typing import Any

from leviathd.errors import InvalidArgument, Unavailable
from leviathd.sandbox import engine as engines
from leviathd.sandbox.container.records import (
    _RUNTIMES_WITH_PROCESS_FILE,
    Record,
    _read_record,
    check_init,
)
from leviathd.sandbox.container.settings import (
    _ENGINE_READS,
    _ENGINE_READS_PREFIXES,
    _ENV_NAME,
    INIT_GID,
    INIT_UID,
)
from leviathd.sandbox.spec import SandboxSpec


def _engine_reads(name: str) -> bool:
    return name in _ENGINE_READS or name.startswith(_ENGINE_READS_PREFIXES)


def exec_env(spec: SandboxSpec) -> dict[str, str]:
    """The engine command's own environment: its fixed one plus the agent's
    variables that travel by name (their values never appear in argv, which
    every user on the host can read in /proc)."""
    env = dict(engines.ENGINE_ENV)
    for k, v in spec.env.items():
        if _ENV_NAME.match(k) and not _engine_reads(k):
            env[k] = v
    return env


def exec_argv(
    container: str, spec: SandboxSpec, eng: engines.DetectedEngine | None = None
) -> list[str]:
    """`<engine> exec` of spec.argv in `container` as the agent's numeric uid
    and gid, in the workdir, with exactly the spec's environment (see exec_env
    for how it travels)."""
    eng = eng or _read_record(container).engine
    # uid:gid, both numeric: the engine then looks nothing up (a name, or a
    # uid alone, would be resolved in files of the container). The engines
    # take no supplementary groups for an exec: the command runs without them.
    argv = [*eng.base(), "exec", "-i", "--user", f"{spec.uid}:{spec.gid}",
            "--workdir", spec.workdir]  # fmt: skip
    for k, v in sorted(spec.env.items()):
        if "\0" in k or "\0" in v:
            raise InvalidArgument(f"environment variable {k!r} holds a NUL byte")
        if _ENV_NAME.match(k) and not _engine_reads(k):
            argv += ["-e", k]
        else:
            argv += ["-e", f"{k}={v}"]
    return [*argv, container, *spec.argv]


EXEC_ENV = "LEVIATH_CONTAINER_EXEC"


def runtime_process(config: Mapping[str, Any], spec: SandboxSpec) -> dict[str, Any]:
    """The OCI process for one command: the container's own process (no
    capabilities, no_new_privs, rlimits, LSM labels) with the agent's numeric
    uid, gid and supplementary gids, and the spec's argv, environment and
    workdir. Pure."""
    process = dict(config["process"])
    user = process.get("user") or {}
    if user.get("uid") != INIT_UID or user.get("gid") != INIT_GID:
        raise Unavailable("the container's init does not run as set up")
    if process.get("capabilities") or not process.get("noNewPrivileges"):
        raise Unavailable("the container's process keeps capabilities or may gain privileges")
    process.update(
        args=list(spec.argv), env=[f"{k}={v}" for k, v in spec.env.items()],
        cwd=spec.workdir, terminal=False,
        user={"uid": spec.uid, "gid": spec.gid,
              "additionalGids": sorted(set(spec.groups) - {spec.gid})},
    )
    process.pop("consoleSize", None)
    return process


def _repair_cgroups(runtime_root: str, container_id: str) -> None:
    """Recreate the container's cgroup folders the runtime will join and that
    systemd removed (it trims v1 controllers a scope does not use, e.g. blkio,
    from the scope's subtree; seen in the bed). They carry no limits: the ones
    that matter (memory, pids) are the scope's own controllers, never trimmed."""
    try:
        with open(os.path.join(runtime_root, container_id, "state.json")) as f:
            paths = json.load(f).get("cgroup_paths") or {}
    except (OSError, ValueError):
        return
    for path in paths.values():
        if isinstance(path, str) and path.startswith("/sys/fs/cgroup/"):
            with contextlib.suppress(OSError):
                os.makedirs(path, exist_ok=True)


def runtime_exec(rec: Record, spec: SandboxSpec) -> tuple[list[str], int] | None:
    """The OCI runtime's own `exec` of spec.argv in the container (argv and
    the descriptor holding the process), or None when only the engine's
    `exec` can do it. About five times faster than `podman exec` (no engine,
    no conmon: the command's stdio are the worker's own descriptors); the
    process is the container's, see runtime_process."""
    name = os.path.basename(rec.runtime_path)
    if (os.environ.get(EXEC_ENV) == "engine" or rec.engine.name != "podman"
            or name not in _RUNTIMES_WITH_PROCESS_FILE or not rec.container_id):  # fmt: skip
        return None
    try:
        with open(rec.oci_config) as f:
            process = runtime_process(json.load(f), spec)
    except (OSError, ValueError, KeyError):
        return None
    root = f"/run/{name}"
    if name == "runc":
        _repair_cgroups(root, rec.container_id)
    fd = os.memfd_create("leviath-process", 0)
    os.set_inheritable(fd, True)  # the runtime opens it by /proc/self/fd
    os.write(fd, json.dumps(process).encode())
    os.lseek(fd, 0, os.SEEK_SET)
    argv = [rec.runtime_path, "--root", root, "exec", "--process", f"/proc/self/fd/{fd}",
            rec.container_id]  # fmt: skip
    return argv, fd


def run(spec: SandboxSpec) -> int:
    """Worker side: the command's exec into the container named by
    spec.hostname: the OCI runtime's exec where it can (runc/crun under
    podman), else the engine's, after checking the container's init is as
    recorded. When the command ends, what it left running in the container
    ends too. Exit status: the command's (the runtime/engine say 126/127 or
    255 when it cannot be started, 128+n when it was killed by signal n)."""
    rec = _read_record(spec.hostname)
    check_init(rec)
    fast = runtime_exec(rec, spec)
    if fast is not None:
        argv, fd = fast
        env = dict(engines.ENGINE_ENV)
    else:
        argv, fd, env = exec_argv(spec.hostname, spec, rec.engine), -1, exec_env(spec)
    child = os.fork()
    if child == 0:  # pragma: no cover - the exec
        try:
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    if fd >= 0:
        os.close(fd)
    _, wstatus = os.waitpid(child, 0)
    end_leftovers(rec)
    code = os.waitstatus_to_exitcode(wstatus)
    return 128 - code if code < 0 else code


def _container_procs(rec: Record) -> str | None:
    """The cgroup.procs file of the container's own cgroup (pids hierarchy
    on v1, the unified one on v2), from the init's /proc entry."""
    try:
        with open(f"/proc/{rec.init_pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers in ("pids", ""):
            base = "/sys/fs/cgroup/pids" if controllers else "/sys/fs/cgroup"
            candidate = base + path + "/cgroup.procs"
            if os.path.exists(candidate):
                return candidate
    return None


def end_leftovers(rec: Record, rounds: int = 50) -> int:
    """SIGKILL every process of the container but its init (what a command
    left in the background), as the namespace kind's per-step PID namespace
    does; returns how many were killed. Repeats while new ones appear: a
    process killed cannot fork, so the set only shrinks."""
    procs = _container_procs(rec)
    if procs is None:
        return 0
    killed = 0
    for _ in range(rounds):
        try:
            with open(procs) as f:
                pids = [int(p) for p in f.read().split() if int(p) != rec.init_pid]
        except (OSError, ValueError):
            return killed
        if not pids:
            return killed
        for pid in pids:
            with contextlib.suppress(OSError):
                pidfd = os.pidfd_open(pid)
                try:
                    # Still in the container (not a reused pid) once we hold it.
                    with open(procs) as f:
                        if str(pid) in f.read().split():
                            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                            killed += 1
                finally:
                    os.close(pidfd)
        time.sleep(0.01)
    return killed
