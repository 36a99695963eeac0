"""The container kind: a warm container per sandbox configuration of an agent,
commands run in it with `exec`, everything torn down when the agent ends.

Daemon side (asyncio, root):
  ensure(agent_id, unit, spec, effective) -> name
      starts (or finds) the agent's container for these settings: its
      processes sit in a cgroup below the agent's scope, so systemd counts them
      (MEM, TASKS, limits) and stops them with the scope;
  teardown(agent_id), sweep(live_ids)
      remove the containers of one agent, or of every agent not alive.
Worker side (the supervisor's worker, root, in the scope, stdio connected):
  run(spec) execs `podman exec` (or docker) for spec.argv in the container
  named by `with_container(spec, name)`, so the agent's stdio and exit status
  flow through the engine.

Why a cgroup below the scope works on a hybrid host (docs/containers.md): with
podman's cgroupfs manager and `--cgroup-parent` set to the scope's own cgroup,
runc makes `<scope>/libpod-<id>` in every hierarchy and applies the container's
own pids/memory limits there; the scope's limits hold over the whole subtree.
conmon, which podman forks, would stay in the daemon's cgroup (killed with the
daemon on restart, invisible to the agent's unit): the engine command therefore
runs from a shell that first joins the scope's cgroups, so conmon is born
inside the scope.

Labels on every container (LABEL_*): the agent, its user and the daemon
instance (machine id and state folder), so a daemon only ever lists and removes
its own containers and finds them again after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import posixpath
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from leviathd.errors import InvalidArgument, Unavailable
from leviathd.sandbox import engine as engines
from leviathd.sandbox.spec import Mount, SandboxSpec, is_within
from leviathd.systemd import absent
from leviathd.systemd.cgroupfs import folders

LABEL_AGENT = "org.leviath.agent"
LABEL_USER = "org.leviath.user"
LABEL_DAEMON = "org.leviath.daemon"
LABEL_CONFIG = "org.leviath.config"
# How an agent that fell back from the namespace kind is marked (lev ps).
FALLBACK_MARK = "fallback:container"

# Where the host's catatonit is bound read-only as the container's PID 1: a
# static init that reaps what exec'd commands leave behind and needs nothing
# from the image. Without one, the engine's --init runs `sleep infinity`.
INIT_TARGET = "/.leviath-init"
_INIT_CANDIDATES = ("/usr/bin/catatonit", "/usr/libexec/podman/catatonit")

# Binds of the spec a container leaves out: the image supplies the system,
# and the spec's scratch home and tmp are replaced by tmpfs. Every other bind
# (workdir, worktree git folders, config mounts, agent state, toolchains,
# caches, known_hosts, and what spec extensions add, such as the tool broker's
# socket folder) is mounted as the spec says.
_BIND_WHY_SKIPPED = frozenset({"system", "home (scratch)", "tmp (scratch)"})
# --mount is comma separated and -v colon separated; such paths are refused
# rather than quoted (a mis-parse would mount the wrong thing).
_BAD_PATH = re.compile(r"[,\n\"=]")

# Environment names the engine command itself reads: these are passed with
# their value on the command line, never through the engine's environment
# (a user's CONTAINERS_CONF must not configure rootful podman).
_ENGINE_READS_PREFIXES = (
    "CONTAINERS_", "CONTAINER_", "PODMAN_", "BUILDAH_", "DOCKER_", "REGISTRY_", "STORAGE_",
    "XDG_", "LD_", "GO", "_CONTAINERS", "NOTIFY_", "LISTEN_", "SSL_", "TMP",
)
_ENGINE_READS = frozenset({"HOME", "PATH", "TMPDIR", "http_proxy", "https_proxy", "no_proxy",
                           "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_PROBE_TTL = 30.0
_engine_cache: dict[str, tuple[float, engines.Engine | str]] = {}
_locks: dict[str, asyncio.Lock] = {}


# --- identity of this daemon ---------------------------------------------------


def state_dir() -> str:
    return os.environ.get("LEVIATH_STATE_DIR", "/var/lib/leviath")


def runtime_dir() -> str:
    return os.environ.get("LEVIATH_RUNTIME_DIR", "/run/leviath")


def daemon_instance() -> str:
    """Names this daemon among others sharing the engine's storage: the
    machine id and the state folder (two daemons with different state folders
    on one host never touch each other's containers)."""
    try:
        with open("/etc/machine-id") as f:
            machine = f.read().strip()
    except OSError:
        machine = "no-machine-id"
    return hashlib.sha256(f"{machine}:{os.path.realpath(state_dir())}".encode()).hexdigest()[:16]


# --- can it be built here? -----------------------------------------------------


def _engine(configured: str) -> engines.Engine:
    """The detected engine, cached for a short while (podman info is ~0.1 s)."""
    now = time.monotonic()
    hit = _engine_cache.get(configured)
    if hit is None or now - hit[0] > _PROBE_TTL:
        try:
            value: engines.Engine | str = engines.detect(configured)
        except engines.EngineUnavailable as exc:
            value = str(exc)
        except (OSError, TimeoutError) as exc:
            value = f"the engine did not answer: {exc}"
        hit = (now, value)
        _engine_cache[configured] = hit
    if isinstance(hit[1], str):
        raise engines.EngineUnavailable(hit[1])
    return hit[1]


def _setting(value: object) -> str:
    return str(getattr(value, "value", value))


def probe(effective: Any) -> str | None:
    """Why the container kind cannot be built here for these settings, or None.

    Checks, in order: root, an engine that answers (and a runtime it can use),
    an image named by the configuration and present in local storage (the
    daemon never pulls: that would reach a registry, as root, at spawn)."""
    if os.geteuid() != 0:
        return "the container kind needs the daemon to run as root"
    try:
        eng = _engine(_setting(effective.engine))
    except engines.EngineUnavailable as exc:
        return str(exc)
    image = effective.image
    if not image:
        return "no image is configured ([sandbox] image)"
    try:
        present = engines.image_present(eng, image)
    except (OSError, TimeoutError) as exc:
        return f"{eng.name} did not answer: {exc}"
    if not present:
        return f"image {image} is not in {eng.name}'s local storage (pull or import it as root)"
    return None


# --- the container's settings (pure) -------------------------------------------


def _check_path(path: str) -> str:
    if _BAD_PATH.search(path) or not path.startswith("/"):
        raise InvalidArgument(
            f"path {path!r} cannot be mounted into a container (commas, quotes, '=' and "
            "newlines are refused)"
        )
    return path


def _bind(source: str, target: str, readonly: bool) -> list[str]:
    opts = f"type=bind,source={_check_path(source)},destination={_check_path(target)}"
    return ["--mount", opts + (",ro=true" if readonly else "")]


def mount_options(
    spec: SandboxSpec,
    engine_name: str,
    *,
    exists: Callable[[str], bool] = os.path.lexists,
    is_dir: Callable[[str], bool] = os.path.isdir,
) -> list[str]:
    """The spec's mounts as engine options: the workdir and every user bind at
    the same path with its access, a throwaway workdir as an overlay, a hidden
    thing inside a mounted folder covered. Hidden paths are otherwise simply
    not mounted: the container sees the image, not the host."""
    out: list[str] = []
    mounted: list[str] = []
    for m in spec.mounts:
        if m.kind == "bind":
            if m.why in _BIND_WHY_SKIPPED or is_within(m.source, spec.scratch):
                continue
            out += _bind(m.source, m.target, m.readonly)
            mounted.append(m.target)
        elif m.kind == "overlay":
            if engine_name != "podman":
                raise InvalidArgument(
                    f"workdir mode throwaway needs podman's overlay mounts, not {engine_name}"
                )
            for p in (m.source, m.target):
                if ":" in _check_path(p):
                    raise InvalidArgument(f"path {p!r} with ':' cannot be an overlay mount")
            out += ["-v", f"{m.source}:{m.target}:O"]
            mounted.append(m.target)
        elif m.kind == "mask" and any(is_within(m.target, t) for t in mounted):
            # (masks inside the system folders the image replaces are moot)
            out += _mask(m, engine_name, exists, is_dir)
    return out


def _mask(
    m: Mount, engine_name: str, exists: Callable[[str], bool], is_dir: Callable[[str], bool]
) -> list[str]:
    # Only what is there needs covering; a missing mount point would be
    # created by the runtime inside the user's bound folder.
    if not exists(m.target):
        return []
    if is_dir(m.target):
        # notmpcopyup: podman would otherwise copy the hidden folder's
        # contents into the tmpfs that is meant to hide them (seen in the bed).
        opts = "ro,mode=000,nosuid,nodev,noexec"
        if engine_name == "podman":
            opts += ",notmpcopyup"
        return ["--tmpfs", f"{_check_path(m.target)}:{opts}"]
    return _bind("/dev/null", m.target, True)


def init_binary() -> str | None:
    for path in _INIT_CANDIDATES:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def container_options(
    spec: SandboxSpec,
    effective: Any,
    engine: engines.Engine,
    *,
    ulimits: Mapping[str, tuple[int, int]],
    network: str,
    init: str | None,
    exists: Callable[[str], bool] = os.path.lexists,
    is_dir: Callable[[str], bool] = os.path.isdir,
) -> list[str]:
    """Every option of `run` that is a sandbox setting (not a name or label):
    the key of the warm container is a hash of these and the image."""
    o: list[str] = [
        "--pull=never",
        "--network", network,
        "--cap-drop", "all",
        "--security-opt", "no-new-privileges",
        "--read-only",
        "--user", f"{spec.uid}:{spec.gid}",
    ]  # fmt: skip
    for g in sorted(set(spec.groups) - {spec.gid}):
        o += ["--group-add", str(g)]
    res = effective.resources
    if res.tasks_max is not None:
        o += ["--pids-limit", str(res.tasks_max)]
    if res.memory_max is not None:
        # Same value for memory+swap: no swap, as for the scope.
        o += ["--memory", str(res.memory_max), "--memory-swap", str(res.memory_max)]
    if res.cpu_quota is not None:
        o += ["--cpus", f"{res.cpu_quota / 100:.2f}"]
    for name, (soft, hard) in sorted(ulimits.items()):
        o += ["--ulimit", f"{name}={soft}:{hard}"]
    home = _check_path(spec.sandbox_home)
    # The home is the user's own, empty: podman chowns with "U", docker hands
    # uid=/gid= to the kernel's tmpfs.
    owner = "U" if engine.name == "podman" else f"uid={spec.uid},gid={spec.gid}"
    o += [
        "--tmpfs", "/tmp:rw,nosuid,nodev,mode=1777",
        "--tmpfs", f"{home}:rw,nosuid,nodev,mode=0700,{owner}",
    ]  # fmt: skip
    o += mount_options(spec, engine.name, exists=exists, is_dir=is_dir)
    if engine.name == "podman":
        # The image's ENV does not reach commands; they get the spec's only.
        o += ["--unsetenv-all"]
    o += ["--log-driver", "none", "--workdir", _check_path(spec.workdir)]
    if init is not None:
        o += _bind(init, INIT_TARGET, True)
        o += ["--entrypoint", INIT_TARGET]
    else:
        o += ["--init", "--entrypoint", "sleep"]
    return o


def idle_command(init: str | None) -> list[str]:
    """What the warm container runs between commands: catatonit in pause mode
    (-P), or `sleep infinity` under the engine's --init."""
    return ["-P"] if init is not None else ["infinity"]


def config_key(options: Iterable[str], image: str, engine: engines.Engine) -> str:
    data = json.dumps([engine.name, engine.runtime, image, *options])
    return hashlib.sha256(data.encode()).hexdigest()[:12]


def container_name(agent_id: str, key: str) -> str:
    return f"leviath-{agent_id}-{key}"


def labels(spec: SandboxSpec, key: str, instance: str) -> list[str]:
    return [
        "--label", f"{LABEL_AGENT}={spec.execution_id}",
        "--label", f"{LABEL_USER}={spec.user}",
        "--label", f"{LABEL_DAEMON}={instance}",
        "--label", f"{LABEL_CONFIG}={key}",
    ]  # fmt: skip


# --- cgroups: the engine is born inside the agent's scope -----------------------


def cgroup_procs_files(cgroup: str, mountinfo: str) -> list[str]:
    """The cgroup.procs file of `cgroup` (a path as systemd's ControlGroup
    gives it) in every mounted hierarchy where that cgroup may exist. Pure over
    the mount table; existence is checked by the caller."""
    return [posixpath.join(folder, "cgroup.procs") for folder in folders(cgroup, mountinfo)]


# A shell that writes its pid into each file before `--`, then execs the rest:
# everything the engine forks (conmon, runc) starts in the agent's scope.
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


async def _unit_cgroup(unit: str) -> str:
    if not absent.booted():
        # No systemd: the daemon made the agent's cgroup itself, named so.
        return absent.control_group(unit)
    proc = await asyncio.create_subprocess_exec(
        "systemctl", "show", "--property=ControlGroup", "--value", unit,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=engines.ENGINE_ENV,
    )
    out, err = await proc.communicate()
    cgroup = out.decode().strip()
    if proc.returncode != 0 or not cgroup.startswith("/"):
        why = err.decode().strip() or "unit not found"
        raise Unavailable(f"no control group for {unit}: {why}")
    return cgroup


def _join_files(cgroup: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        mountinfo = f.read()
    files = [p for p in cgroup_procs_files(cgroup, mountinfo) if os.path.exists(p)]
    if not files:
        raise Unavailable(f"the agent's control group {cgroup} is not mounted here")
    return files


# --- running the engine --------------------------------------------------------


async def _engine_cmd(argv: list[str], timeout: float = 60.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=engines.ENGINE_ENV,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return 124, "", f"{argv[0]} did not answer within {timeout:.0f}s"
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def _record_path(name: str) -> str:
    return os.path.join(runtime_dir(), "containers", f"{name}.json")


@dataclasses.dataclass(frozen=True)
class Record:
    """What the worker needs to exec into a container (it has only the spec):
    written by `ensure` under the runtime folder, root only."""

    engine: engines.Engine
    container_id: str = ""
    oci_config: str = ""  # the container's OCI config.json (podman)
    runtime_path: str = ""  # the OCI runtime binary that runs it (podman)


def _write_record(name: str, rec: Record) -> None:
    folder = os.path.dirname(_record_path(name))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    tmp = _record_path(name) + ".tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(dataclasses.asdict(rec), f)
    os.rename(tmp, _record_path(name))


def _read_record(name: str) -> Record:
    try:
        with open(_record_path(name)) as f:
            data = json.load(f)
        eng = engines.Engine(**data.pop("engine"))
        return Record(engine=eng, **data)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise Unavailable(f"container {name} is not known to this daemon: {exc}") from None


async def _record_for(eng: engines.Engine, name: str, found: dict[str, Any] | None) -> Record:
    info = found if found is not None else await _inspect(eng, name)
    if eng.name != "podman" or info is None:
        return Record(engine=eng)
    runtime = str(info.get("OCIRuntime") or "")
    path = runtime if runtime.startswith("/") else (engines.find_binary(runtime) or "")
    return Record(
        engine=eng, container_id=str(info.get("Id") or ""),
        oci_config=str(info.get("OCIConfigPath") or ""), runtime_path=path,
    )


async def _inspect(eng: engines.Engine, name: str) -> dict[str, Any] | None:
    rc, out, _ = await _engine_cmd([*eng.base(), "container", "inspect", name])
    if rc != 0:
        return None
    data = json.loads(out or "[]")
    return data[0] if data else None


async def ensure(agent_id: str, unit: str, spec: SandboxSpec, effective: Any) -> str:
    """Start (or find) the warm container of `agent_id` for these settings and
    return its name. Stages whose settings are identical get the same one.

    Call after the agent's scope exists (its cgroup is the container's parent)
    and before the worker runs `run(with_container(spec, name))`."""
    if spec.execution_id != agent_id:
        raise InvalidArgument("the spec was built for another agent")
    try:
        eng = _engine(_setting(effective.engine))
    except engines.EngineUnavailable as exc:
        raise Unavailable(f"the container sandbox cannot be built here: {exc}") from None
    image = effective.image
    if not image:
        raise Unavailable("the container sandbox needs an image ([sandbox] image)")
    init = init_binary()
    options = container_options(
        spec, effective, eng, ulimits=engines.current_ulimits(),
        network=engines.network_mode(spec.network), init=init,
    )
    key = config_key(options, image, eng)
    name = container_name(agent_id, key)
    instance = daemon_instance()
    lock = _locks.setdefault(name, asyncio.Lock())
    async with lock:
        found = await _inspect(eng, name)
        if found is not None:
            found_labels = (found.get("Config") or {}).get("Labels") or {}
            if found_labels.get(LABEL_DAEMON) != instance:
                raise Unavailable(f"a container named {name} exists and is not this daemon's")
            if (found.get("State") or {}).get("Running"):
                _write_record(name, await _record_for(eng, name, found))
                return name
            await _engine_cmd([*eng.base(), "rm", "-f", name])
        cgroup = await _unit_cgroup(unit)
        argv = [
            "sh", "-c", _JOIN, "join", *_join_files(cgroup), "--",
            *eng.base(), "run", "-d", "--name", name, "--hostname", name,
            *labels(spec, key, instance), "--cgroup-parent", cgroup,
            *options, image, *idle_command(init),
        ]  # fmt: skip
        rc, _out, err = await _engine_cmd(argv)
        if rc != 0:
            await _engine_cmd([*eng.base(), "rm", "-f", name])
            raise Unavailable(f"{eng.name} could not start the agent's container: {_tail(err)}")
        _write_record(name, await _record_for(eng, name, None))
    _locks.pop(name, None)
    return name


def with_container(spec: SandboxSpec, name: str) -> SandboxSpec:
    """The spec the worker gets: for the container kind, its hostname is the
    container's name (and the container's hostname), which `run` execs into."""
    return dataclasses.replace(spec, hostname=name)


# --- the worker side -----------------------------------------------------------


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


def exec_argv(container: str, spec: SandboxSpec, eng: engines.Engine | None = None) -> list[str]:
    """`<engine> exec` of spec.argv in `container` (as the user it was
    started as), in the workdir,
    with exactly the spec's environment (see exec_env for how it travels)."""
    eng = eng or _read_record(container).engine
    # No --user: the container runs as the user already, and an exec with
    # --user loses the supplementary groups given at `run` (seen with podman).
    argv = [*eng.base(), "exec", "-i", "--workdir", spec.workdir]
    for k, v in sorted(spec.env.items()):
        if "\0" in k or "\0" in v:
            raise InvalidArgument(f"environment variable {k!r} holds a NUL byte")
        if _ENV_NAME.match(k) and not _engine_reads(k):
            argv += ["-e", k]
        else:
            argv += ["-e", f"{k}={v}"]
    return [*argv, container, *spec.argv]


EXEC_ENV = "LEVIATH_CONTAINER_EXEC"
_RUNTIMES_WITH_PROCESS_FILE = ("runc", "crun")


def runtime_process(config: Mapping[str, Any], spec: SandboxSpec) -> dict[str, Any]:
    """The OCI process for one command: the container's own process (its
    user and groups, no capabilities, no_new_privs, rlimits, LSM labels) with
    the spec's argv, environment and workdir. Pure."""
    process = dict(config["process"])
    user = process.get("user") or {}
    if user.get("uid") != spec.uid or user.get("gid") != spec.gid:
        raise Unavailable("the container does not run as the agent's user")
    if process.get("capabilities") or not process.get("noNewPrivileges"):
        raise Unavailable("the container's process keeps capabilities or may gain privileges")
    process.update(
        args=list(spec.argv), env=[f"{k}={v}" for k, v in spec.env.items()],
        cwd=spec.workdir, terminal=False,
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
    """Worker side: replace this process with the command's exec into the
    container named by spec.hostname: the OCI runtime's exec where it can
    (runc/crun under podman), else the engine's. Exit status: the command's
    (the runtime/engine say 126/127 or 255 when it cannot be started, 128+n
    when it was killed by signal n)."""
    rec = _read_record(spec.hostname)
    fast = runtime_exec(rec, spec)
    if fast is not None:
        argv, _fd = fast
        os.execve(argv[0], argv, dict(engines.ENGINE_ENV))
    argv = exec_argv(spec.hostname, spec, rec.engine)
    os.execve(argv[0], argv, exec_env(spec))


# --- teardown ------------------------------------------------------------------


def _present_engines() -> list[engines.Engine]:
    """Every engine binary here, for cleanup (which needs no image)."""
    out: list[engines.Engine] = []
    for name in ("podman", "docker"):
        path = engines.find_binary(name)
        if path is None:
            continue
        try:
            out.append(_engine(name))
        except engines.EngineUnavailable:
            if name == "podman":
                out.append(engines.Engine("podman", path, None))
    return out


async def _list(eng: engines.Engine, *filters: str) -> list[tuple[str, dict[str, str]]]:
    """(name, labels) of this daemon's containers matching the label filters."""
    argv = [*eng.base(), "ps", "-a", "--filter", f"label={LABEL_DAEMON}={daemon_instance()}"]
    for f in filters:
        argv += ["--filter", f"label={f}"]
    if eng.name == "podman":
        rc, out, _ = await _engine_cmd([*argv, "--format", "json"])
        if rc != 0:
            return []
        rows = json.loads(out or "[]")
        return [(r["Names"][0], dict(r.get("Labels") or {})) for r in rows if r.get("Names")]
    rc, out, _ = await _engine_cmd([*argv, "--format", "{{json .}}"])
    if rc != 0:
        return []
    result = []
    for line in out.splitlines():
        row = json.loads(line)
        pairs = (kv.partition("=") for kv in str(row.get("Labels", "")).split(",") if kv)
        result.append((str(row["Names"]).split(",")[0], {k: v for k, _, v in pairs}))
    return result


async def _remove(eng: engines.Engine, names: list[str]) -> None:
    if not names:
        return
    rm = [*eng.base(), "rm", "-f"] + (["-t", "0"] if eng.name == "podman" else [])
    await _engine_cmd([*rm, *names])
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(_record_path(name))


async def teardown(agent_id: str) -> list[str]:
    """Remove every container of this daemon labelled with `agent_id`; returns
    their names."""
    removed: list[str] = []
    for eng in _present_engines():
        names = [n for n, _ in await _list(eng, f"{LABEL_AGENT}={agent_id}")]
        await _remove(eng, names)
        removed += names
    return removed


async def end_hook(rec: Any) -> None:
    """For `Agents.end_hooks`: an agent with a container step (its record's
    sandbox is "container" or, with stages, e.g. "namespace+container") loses
    its containers when it ends, however it ends."""
    if "container" in str(rec.sandbox).split("+"):
        await teardown(str(rec.id))


async def sweep(live_ids: Iterable[str]) -> list[str]:
    """At daemon start: remove this daemon's containers whose agent is not
    alive (it ended while the daemon was away). Returns their names."""
    live = set(live_ids)
    removed: list[str] = []
    for eng in _present_engines():
        names = [n for n, lab in await _list(eng) if lab.get(LABEL_AGENT) not in live]
        await _remove(eng, names)
        removed += names
    return removed


def _tail(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " / ".join(lines[-3:]) if lines else "no output"
