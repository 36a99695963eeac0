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
import grp
import hashlib
import json
import os
import posixpath
import re
import signal
import sys
import syslog
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from leviathd import fsat, resource_defaults
from leviathd.agents.request import refuse_system_workdir
from leviathd.errors import InvalidArgument, Unavailable
from leviathd.events import Event
from leviathd.paths import runtime_dir, state_dir
from leviathd.sandbox import engine as engines
from leviathd.sandbox import guard, oci_seccomp, pinned
from leviathd.sandbox.spec import Mount, SandboxSpec, is_within
from leviathd.systemd import absent, journal
from leviathd.systemd.cgroupfs import folders
from leviathd.systemd.manager import SystemdError, SystemdManager

LABEL_AGENT = "org.leviath.agent"
LABEL_USER = "org.leviath.user"
LABEL_DAEMON = "org.leviath.daemon"
LABEL_CONFIG = "org.leviath.config"
# Where the host's catatonit is bound read-only as the container's PID 1: a
# static init that reaps what exec'd commands leave behind and needs nothing
# from the image. Without one, the engine's --init runs `sleep infinity`.
INIT_TARGET = "/.leviath-init"
_INIT_CANDIDATES = ("/usr/bin/catatonit", "/usr/libexec/podman/catatonit")

# Who the container's PID 1 runs as: never the agent's uid, so the agent can
# neither ptrace it nor open its /proc/1/mem, and so cannot move it into
# namespaces of its own making that root's `exec` would then join (issue 22).
# Every command is exec'd with the agent's numeric ids instead.
INIT_UID = INIT_GID = 65534
# The container's /etc/passwd and /etc/group: files the daemon writes, bound
# read-only over the image's. The runtime resolves an exec's supplementary
# groups in the container's /etc/group (by name first, runc 1.1), so that file
# must be neither the image's nor the agent's.
_IDENTITY_FILES = ("passwd", "group")

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
# (engine, its path, image) -> when the image was last seen in its storage.
_image_seen: dict[tuple[str, str, str], float] = {}
_locks: dict[str, asyncio.Lock] = {}


# --- identity of this daemon ---------------------------------------------------


def seccomp_dir() -> str:
    return os.path.join(runtime_dir(), "seccomp")


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


def probe(effective: Any) -> str | None:
    """Why the container kind cannot be built here for these settings, or None.

    Checks, in order: root, an engine that answers (and a runtime it can use),
    an image named by the configuration and present in local storage (the
    daemon never pulls: that would reach a registry, as root, at spawn)."""
    if os.geteuid() != 0:
        return "the container kind needs the daemon to run as root"
    try:
        eng = _engine(str(effective.engine))
    except engines.EngineUnavailable as exc:
        return str(exc)
    image = effective.image
    if not image:
        return "no image is configured ([sandbox] image)"
    seen = (eng.name, eng.path, str(image))
    if time.monotonic() - _image_seen.get(seen, -_PROBE_TTL) < _PROBE_TTL:
        # Seen there a moment ago: one engine call (a tenth of a second) less
        # per start. Runs never pull (--pull=never), so an image removed
        # meanwhile fails that start with the engine's message.
        return None
    try:
        present = engines.image_present(eng, image)
    except (OSError, TimeoutError) as exc:
        return f"{eng.name} did not answer: {exc}"
    if not present:
        _image_seen.pop(seen, None)
        return f"image {image} is not in {eng.name}'s local storage (pull or import it as root)"
    _image_seen[seen] = time.monotonic()
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
    workdir_source: str | None = None,
) -> list[str]:
    """The spec's mounts as engine options: the workdir and every user bind at
    the same path with its access, a throwaway workdir as an overlay, a hidden
    thing inside a mounted folder covered. Hidden paths are otherwise simply
    not mounted: the container sees the image, not the host. `workdir_source`:
    where the engine finds the workdir (its pinned copy, see pinned.py)."""
    out: list[str] = []
    mounted: list[str] = []
    for m in spec.mounts:
        source = m.source
        if workdir_source and m.target == spec.workdir and m.source == spec.workdir:
            source = workdir_source
        if m.kind == "bind":
            if m.why in _BIND_WHY_SKIPPED or is_within(m.source, spec.scratch):
                continue
            out += _bind(source, m.target, m.readonly)
            mounted.append(m.target)
        elif m.kind == "overlay":
            if engine_name != "podman":
                raise InvalidArgument(
                    f"workdir mode throwaway needs podman's overlay mounts, not {engine_name}"
                )
            for p in (source, m.target):
                if ":" in _check_path(p):
                    raise InvalidArgument(f"path {p!r} with ':' cannot be an overlay mount")
            out += ["-v", f"{source}:{m.target}:O"]
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
    workdir_source: str | None = None,
) -> list[str]:
    """Every option of `run` that is a sandbox setting (not a name or label):
    the key of the warm container is a hash of these and the image."""
    o: list[str] = [
        "--pull=never",
        "--network", network,
        "--cap-drop", "all",
        "--security-opt", "no-new-privileges",
        *oci_seccomp.security_opt(seccomp_dir(), spec.allow_io_uring),
        "--read-only",
        "--user", f"{INIT_UID}:{INIT_GID}",
    ]  # fmt: skip
    # The spec's limits: the config's, or the machine's defaults (without
    # systemd these are the only limits the agent has).
    tasks_max, memory_max = spec.limits.get("tasks_max"), spec.limits.get("memory_max")
    cpu_quota = spec.limits.get("cpu_quota")
    if tasks_max is not None:
        o += ["--pids-limit", str(tasks_max)]
    if memory_max is not None:
        # Same value for memory+swap: no swap, as for the scope.
        o += ["--memory", str(memory_max), "--memory-swap", str(memory_max)]
    if cpu_quota is not None:
        o += ["--cpus", f"{cpu_quota / 100:.2f}"]
    for name, (soft, hard) in sorted(ulimits.items()):
        o += ["--ulimit", f"{name}={soft}:{hard}"]
    if spec.uid == INIT_UID:
        raise InvalidArgument(f"uid {INIT_UID} cannot run container agents (their init runs as it)")
    home = _check_path(spec.sandbox_home)
    # The home is the user's own, empty. Docker hands uid=/gid= to the
    # kernel's tmpfs; podman refuses them (and its "U" would chown to the
    # init's user): `ensure` chowns it once the container runs (own_home).
    owner = "" if engine.name == "podman" else f",uid={spec.uid},gid={spec.gid}"
    # Sized from the agent's memory limit, as in the namespace kind.
    shm = resource_defaults.tmpfs_size(spec.limits)
    size = "" if shm is None else f",size={shm}"
    o += [
        "--tmpfs", f"/tmp:rw,nosuid,nodev,mode=1777{size}",
        "--tmpfs", f"{home}:rw,nosuid,nodev,mode=0700{owner}{size}",
    ] + ([] if shm is None else ["--shm-size", str(shm)])  # fmt: skip
    o += mount_options(spec, engine.name, exists=exists, is_dir=is_dir,
                       workdir_source=workdir_source)  # fmt: skip
    # Last, so they lie over whatever a mount of /etc brought.
    for name in _IDENTITY_FILES:
        o += _bind(identity_path(spec, name), f"/etc/{name}", True)
    if engine.name == "podman":
        # The image's ENV does not reach commands; they get the spec's only.
        o += ["--unsetenv-all"]
    # The init's folder is /: commands get the workdir with their exec.
    o += ["--log-driver", "none", "--workdir", "/"]
    if init is not None:
        o += _bind(init, INIT_TARGET, True)
        o += ["--entrypoint", INIT_TARGET]
    else:
        o += ["--init", "--entrypoint", "sleep"]
    return o


def identity_path(spec: SandboxSpec, name: str) -> str:
    return os.path.join(runtime_dir(), "containers", spec.execution_id, name)


def _group_name(gid: int, lookup: Callable[[int], str]) -> str:
    # A name made of digits would be taken for a gid by the runtime's lookup.
    try:
        name = lookup(gid)
    except (KeyError, OSError):
        name = ""
    ok = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}", name) is not None
    return name if ok else f"g{gid}"


def identity_files(
    spec: SandboxSpec, group_name: Callable[[int], str] = lambda g: grp.getgrgid(g).gr_name
) -> dict[str, str]:
    """The container's /etc/passwd and /etc/group: root, the init's user and
    the agent's user with exactly its groups. Pure but for the group names."""
    user = spec.user if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}", spec.user) else "agent"
    passwd = (
        "root:x:0:0:root:/root:/sbin/nologin\n"
        f"nobody:x:{INIT_UID}:{INIT_GID}:nobody:/nonexistent:/sbin/nologin\n"
        f"{user}:x:{spec.uid}:{spec.gid}::{spec.sandbox_home}:/bin/sh\n"
    )
    lines = {0: "root:x:0:", INIT_GID: f"nogroup:x:{INIT_GID}:"}
    for gid in sorted({spec.gid, *spec.groups}):
        lines[gid] = f"{_group_name(gid, group_name)}:x:{gid}:{user}"
    return {"passwd": passwd, "group": "".join(f"{ln}\n" for ln in lines.values())}


def _write_identity(spec: SandboxSpec) -> None:
    containers = fsat.open_dir(os.path.join(runtime_dir(), "containers"), create_mode=0o700)
    try:
        fsat.mkdir_at(containers, spec.execution_id, 0o755, exist_ok=True)
        folder = fsat.open_dir_at(containers, spec.execution_id)
    finally:
        os.close(containers)
    try:
        for name, text in identity_files(spec).items():
            fsat.atomic_write_at(folder, name, text.encode(), mode=0o644)
    finally:
        os.close(folder)


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


# The engine's limit options and the cgroup v2 controller each one writes.
_LIMIT_CONTROLLERS = {"--memory": "memory", "--memory-swap": "memory",
                      "--pids-limit": "pids", "--cpus": "cpu"}  # fmt: skip


def limits_the_parent_can_take(options: Sequence[str], subtree_control: str | None) -> list[str]:
    """`options` without the limit options whose controller the parent cgroup
    does not enable for its children (subtree_control: the text of its
    cgroup.subtree_control on a pure cgroup v2 host, None elsewhere).

    On pure cgroup v2 the agent's scope is not delegated and holds processes
    (the supervisor, conmon), so its children can never get the memory or pids
    controller (v2's no-internal-process rule): crun then fails to open
    memory.max and the container does not start (seen on Debian 13 once every
    agent got a default MemoryMax). Leaving those options out costs nothing:
    the scope's own MemoryMax, MemorySwapMax=0, TasksMax and CPUQuota, set
    from the same limits, hold over the container's cgroup below it."""
    if subtree_control is None:
        return list(options)
    enabled = set(subtree_control.split())
    out: list[str] = []
    skip = False
    for i, opt in enumerate(options):
        if skip:
            skip = False
            continue
        controller = _LIMIT_CONTROLLERS.get(opt)
        if controller is not None and controller not in enabled and i + 1 < len(options):
            skip = True
            continue
        out.append(opt)
    return out


def _subtree_control(cgroup: str) -> str | None:
    """The parent's cgroup.subtree_control on a pure cgroup v2 host, else None
    (v1 and hybrid hosts: the engine makes its cgroup in each v1 hierarchy,
    where every controller is there)."""
    if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        return None
    try:
        with open(f"/sys/fs/cgroup{cgroup}/cgroup.subtree_control", encoding="ascii") as f:
            return f.read(4096)
    except (OSError, ValueError):
        return ""


def cgroup_procs_files(cgroup: str, mountinfo: str) -> list[str]:
    """The cgroup.procs file of `cgroup` (a path as systemd's ControlGroup
    gives it) in every mounted hierarchy where that cgroup may exist. Pure over
    the mount table; existence is checked by the caller."""
    return [posixpath.join(folder, "cgroup.procs") for folder in folders(cgroup, mountinfo)]


# A shell that writes its pid into each file before `--`, then execs the rest:
# everything the engine forks (conmon, runc) starts in the agent's scope.
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


async def _unit_cgroup(units: SystemdManager, unit: str) -> str:
    if not absent.booted():
        # No systemd: the daemon made the agent's cgroup itself, named so.
        return absent.control_group(unit)
    try:
        state = await units.unit_state(unit)
    except SystemdError as exc:
        raise Unavailable(f"no control group for {unit}: {exc}") from None
    cgroup = state.control_group if state is not None else ""
    if not cgroup.startswith("/"):
        raise Unavailable(f"no control group for {unit}: unit not found")
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
    # The container's PID 1 as the daemon found it right after the start:
    # every exec joins its namespaces, so each exec first checks they are
    # still these (see check_init).
    init_pid: int = 0
    init_start: str = ""  # its start time (field 22 of /proc/PID/stat)
    namespaces: dict[str, str] = dataclasses.field(default_factory=dict)


def _write_record(name: str, rec: Record) -> None:
    dfd = fsat.open_dir(os.path.dirname(_record_path(name)), create_mode=0o700)
    try:
        data = json.dumps(dataclasses.asdict(rec)).encode()
        fsat.atomic_write_at(dfd, f"{name}.json", data, mode=0o600)
    finally:
        os.close(dfd)


def _read_record(name: str) -> Record:
    try:
        with open(_record_path(name)) as f:
            data = json.load(f)
        eng = engines.Engine(**data.pop("engine"))
        return Record(engine=eng, **data)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise Unavailable(f"container {name} is not known to this daemon: {exc}") from None


# The namespaces an exec joins (runc: those of the container's PID 1) and
# the user namespace, which must stay the host's.
_NAMESPACES = ("mnt", "pid", "net", "ipc", "uts", "cgroup", "user")


def _start_time(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        # The command name (field 2) may hold spaces: count from its ')'.
        return f.read().rsplit(")", 1)[1].split()[19]


def _namespace_ids(pid: int) -> dict[str, str]:
    return {ns: os.readlink(f"/proc/{pid}/ns/{ns}") for ns in _NAMESPACES}


def init_state(pid: int) -> tuple[str, dict[str, str], tuple[int, ...]]:
    """(start time, namespaces, real/effective/saved/fs uids) of `pid`."""
    start = _start_time(pid)
    namespaces = _namespace_ids(pid)
    with open(f"/proc/{pid}/status") as f:
        uids = next(ln for ln in f if ln.startswith("Uid:")).split()[1:]
    if _start_time(pid) != start:
        raise ProcessLookupError(pid)
    return start, namespaces, tuple(int(u) for u in uids)


def check_init(rec: Record) -> None:
    """Refuse to exec into a container whose PID 1 is not the one recorded at
    its start, runs as someone else, or sits in other namespaces (or in a
    user namespace other than the host's): the exec would join them."""
    if rec.init_pid <= 0:
        raise Unavailable("the container's init was not recorded at its start")
    try:
        start, namespaces, uids = init_state(rec.init_pid)
    except (OSError, StopIteration, IndexError, ValueError):
        raise Unavailable("the container's init is gone") from None
    if start != rec.init_start or any(u != INIT_UID for u in uids):
        raise Unavailable("the container's init is not the process it started with")
    if namespaces != rec.namespaces or namespaces["user"] != os.readlink("/proc/self/ns/user"):
        raise Unavailable("the container's init left the namespaces it started in; refused")


async def _record_for(eng: engines.Engine, name: str, found: dict[str, Any] | None) -> Record:
    info = found if found is not None else await _inspect(eng, name)
    if info is None:
        raise Unavailable(f"container {name} vanished as it started")
    pid = int((info.get("State") or {}).get("Pid") or 0)
    try:
        start, namespaces, uids = init_state(pid) if pid > 0 else ("", {}, ())
    except (OSError, StopIteration, IndexError, ValueError):
        start, namespaces, uids = "", {}, ()
    if not start or any(u != INIT_UID for u in uids) or namespaces.get("user") != os.readlink(
        "/proc/self/ns/user"
    ):
        raise Unavailable(f"container {name}'s init is not running as set up (uid {INIT_UID})")
    rec = Record(engine=eng, init_pid=pid, init_start=start, namespaces=namespaces)
    if eng.name != "podman":
        return rec
    runtime = str(info.get("OCIRuntime") or "")
    path = runtime if runtime.startswith("/") else (engines.find_binary(runtime) or "")
    return dataclasses.replace(
        rec, container_id=str(info.get("Id") or ""),
        oci_config=str(info.get("OCIConfigPath") or ""), runtime_path=path,
    )


_CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")
# Where rootful podman has runc and crun keep their state (--root /run/NAME).
RUNTIME_STATE_ROOT = "/run"


def _runtime_state(eng: engines.Engine, run_output: str) -> dict[str, Any] | None:
    """What _record_for needs of `inspect` (init pid, id, OCI config, runtime),
    read from the OCI runtime's own state of the container `podman run -d`
    just printed the id of: root's files under /run/RUNTIME, where
    runtime_exec looks too. Saves an engine call (a tenth of a second) per
    start (issue 18). None (then `inspect` is asked) for another engine, a
    runtime podman chose itself, or a state not as expected."""
    lines = run_output.strip().splitlines()
    cid = lines[-1].strip() if lines else ""
    runtime = os.path.basename(eng.runtime or eng.default_runtime)
    if eng.name != "podman" or runtime not in _RUNTIMES_WITH_PROCESS_FILE:
        return None
    if not _CONTAINER_ID.match(cid):
        return None
    try:
        if runtime == "runc":
            with open(f"{RUNTIME_STATE_ROOT}/runc/{cid}/state.json") as f:
                state = json.load(f)
            pid = state.get("init_process_pid")
            bundles = [lb[len("bundle="):] for lb in (state.get("config") or {}).get("labels") or []
                       if isinstance(lb, str) and lb.startswith("bundle=")]  # fmt: skip
            bundle = bundles[0] if len(bundles) == 1 else ""
        else:
            with open(f"{RUNTIME_STATE_ROOT}/crun/{cid}/status") as f:
                state = json.load(f)
            pid, bundle = state.get("pid"), state.get("bundle")
    except (OSError, ValueError, AttributeError):
        return None
    if state.get("id", cid) != cid or not isinstance(pid, int) or pid <= 0:
        return None
    if not isinstance(bundle, str) or not bundle.startswith("/"):
        return None
    return {"State": {"Pid": pid}, "Id": cid, "OCIRuntime": eng.runtime or eng.default_runtime,
            "OCIConfigPath": os.path.join(bundle, "config.json")}  # fmt: skip


async def _inspect(eng: engines.Engine, name: str) -> dict[str, Any] | None:
    rc, out, _ = await _engine_cmd([*eng.base(), "container", "inspect", name])
    if rc != 0:
        return None
    data = json.loads(out or "[]")
    return data[0] if data else None


async def ensure(
    agent_id: str, unit: str, spec: SandboxSpec, effective: Any, *, units: SystemdManager,
    started: set[str] | None = None, pinned_workdir: str | None = None,
) -> str:
    """Start (or find) the warm container of `agent_id` for these settings and
    return its name. Stages whose settings are identical get the same one;
    `started` (names this caller already ensured, updated here) spares them
    another look at the engine, so a request costs one per distinct container.
    `pinned_workdir`: the workdir as the user opened it (spawn.Held.
    workdir_path()); the engine then binds it from a root-only path (pin)
    rather than by the workdir's own path, which the user could change.
    `units`: the systemd manager, for the control group of the agent's scope.

    Call after the agent's scope exists (its cgroup is the container's parent)
    and before the worker runs `run(with_container(spec, name))`."""
    if spec.execution_id != agent_id:
        raise InvalidArgument("the spec was built for another agent")
    try:
        # (podman info, when not cached: off the event loop)
        eng = await asyncio.to_thread(_engine, str(effective.engine))
    except engines.EngineUnavailable as exc:
        raise Unavailable(f"the container sandbox cannot be built here: {exc}") from None
    image = effective.image
    if not image:
        raise Unavailable("the container sandbox needs an image ([sandbox] image)")
    init = init_binary()
    source = None
    if pinned_workdir is not None:
        source = await asyncio.to_thread(pin, agent_id, pinned_workdir, spec.workdir)
    # (it looks at the user's folders, which may be slow to answer: off the loop)
    options = await asyncio.to_thread(
        lambda: container_options(
            spec, effective, eng, ulimits=engines.current_ulimits(),
            network=engines.network_mode(spec.network), init=init, workdir_source=source,
        )
    )
    oci_seccomp.write(seccomp_dir(), spec.allow_io_uring)
    # Its protected paths are applied once, when it starts: they belong to its key.
    protect = [f"protect:{m.target}:{m.readonly}" for m in spec.mounts if m.kind == "protect"]
    key = config_key([*options, *protect], image, eng)
    name = container_name(agent_id, key)
    if started is not None and name in started:
        return name
    instance = daemon_instance()
    lock = _locks.setdefault(name, asyncio.Lock())
    async with lock:
        await asyncio.to_thread(_write_identity, spec)
        await asyncio.to_thread(recheck_workdir, spec)
        cgroup = await _unit_cgroup(units, unit)
        run_options = limits_the_parent_can_take(options, _subtree_control(cgroup))
        argv = [
            "sh", "-c", _JOIN, "join", *_join_files(cgroup), "--",
            *eng.base(), "run", "-d", "--name", name, "--hostname", name,
            *labels(spec, key, instance), "--cgroup-parent", cgroup,
            *run_options, image, *idle_command(init),
        ]  # fmt: skip
        # Run first, look only when that fails: the name holds the agent's new
        # id, so a container of that name is a rare leftover, and each call of
        # the engine costs about a tenth of a second (issue 18).
        rc, out, err = await _engine_cmd(argv)
        if rc != 0:
            found = await _inspect(eng, name)
            if found is not None:
                found_labels = (found.get("Config") or {}).get("Labels") or {}
                if found_labels.get(LABEL_DAEMON) != instance:
                    raise Unavailable(f"a container named {name} exists and is not this daemon's")
                if (found.get("State") or {}).get("Running"):
                    # Its init as recorded when it started, never as it is now.
                    check_init(_read_record(name))
                    if started is not None:
                        started.add(name)
                    return name
                await _engine_cmd([*eng.base(), "rm", "-f", name])
                rc, out, err = await _engine_cmd(argv)
        if rc != 0:
            await _engine_cmd([*eng.base(), "rm", "-f", name])
            raise Unavailable(f"{eng.name} could not start the agent's container: {_tail(err)}")
        rec = await _record_for(eng, name, _runtime_state(eng, out))
        try:
            own_home(rec.init_pid, spec)
            # Before any agent command runs in it (see guard.py).
            await asyncio.to_thread(guard.apply_in, rec.init_pid, spec)
            if spec.proxy:
                await start_forwarder(rec.init_pid, cgroup, spec)
        except (OSError, guard.GuardError, Unavailable) as exc:
            await _engine_cmd([*eng.base(), "rm", "-f", name])
            raise Unavailable(f"preparing the agent's container: {exc}") from None
        _write_record(name, rec)
        journal.record(
            f"agent {agent_id}: {eng.name} started container {name}"
            + (f": {_tail(err)}" if err.strip() else ""),
            priority=syslog.LOG_DEBUG, LEVIATH_AGENT=agent_id, LEVIATH_EVENT=Event.CONTAINER_START,
        )
    _locks.pop(name, None)
    if started is not None:
        started.add(name)
    return name


async def start_forwarder(init_pid: int, cgroup: str, spec: SandboxSpec) -> None:
    """network = "proxy": the relay to the daemon's proxy (proxy/forwarder.py)
    in the container's network namespace (the engine's `none`: only lo),
    born in the agent's scope so the proxy knows whose it is and systemd
    ends it with the agent. The namespace travels as a descriptor opened
    here from the init checked at start, not as a pid the forwarder opens."""
    from leviathd.proxy import forwarder

    sock = os.path.join(runtime_dir(), "agents", spec.execution_id, forwarder.SOCKET_NAME)
    netns = os.open(f"/proc/{init_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        argv = ["sh", "-c", _JOIN, "join", *_join_files(cgroup), "--",
                sys.executable, "-m", "leviathd.proxy.forwarder", str(netns), sock,
                str(spec.uid), str(spec.gid), *(str(g) for g in spec.groups)]  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, pass_fds=(netns,),
        )  # the daemon's own environment: its Python finds this leviathd
        try:
            _out, err = await asyncio.wait_for(proc.communicate(), 30)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise Unavailable("the proxy forwarder did not start within 30 s") from None
    finally:
        os.close(netns)
    if proc.returncode != 0:
        why = _tail(err.decode(errors="replace"))
        raise Unavailable(f"the proxy forwarder did not start: {why}")


def own_home(init_pid: int, spec: SandboxSpec) -> None:
    """Give the container's fresh home tmpfs to the agent's user, through
    the init's root: nothing of the agent has run in it yet, and the last
    component is opened without following links all the same."""
    fd = os.open(f"/proc/{init_pid}/root{spec.sandbox_home}",
                 os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)  # fmt: skip
    try:
        st = os.fstat(fd)
        if st.st_uid not in (0, spec.uid, INIT_UID):
            raise PermissionError(f"{spec.sandbox_home} belongs to uid {st.st_uid}")
        os.fchown(fd, spec.uid, spec.gid)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _pin_folder(agent_id: str) -> str:
    return os.path.join(runtime_dir(), "containers", "pinned", agent_id)


def pin(agent_id: str, pinned_workdir: str, workdir: str) -> str:
    """The root-only path where the agent's pinned workdir is bound (made once
    per agent; the same path for every container of it, so stages with the
    same settings still share one)."""
    folder = _pin_folder(agent_id)
    path = os.path.join(folder, "workdir")
    with contextlib.suppress(OSError):
        if os.path.ismount(path):
            return path
    return pinned.bind_pinned(pinned_workdir, folder, "workdir", expect=workdir)


def unpin(agent_id: str) -> None:
    with contextlib.suppress(OSError, Unavailable):
        pinned.release(_pin_folder(agent_id))


def recheck_workdir(spec: SandboxSpec) -> None:
    """Just before the engine binds it: the workdir still resolves to itself
    (no link swapped in since the spec was built), and is neither a system
    folder, the whole home, nor inside a hidden path. The engine binds by
    path, so a swap after this check is still possible; it would show the
    agent only what its user can open anyway (see docs/containers.md)."""
    workdir = spec.workdir
    if os.path.realpath(workdir) != workdir:
        raise InvalidArgument(f"workdir {workdir} changed (it now leads elsewhere); refused")
    refuse_system_workdir(workdir, spec.sandbox_home)
    if is_within(spec.sandbox_home, workdir):
        raise InvalidArgument(f"workdir {workdir} would show the whole home folder")
    hit = next((h for h in spec.hidden if is_within(workdir, h)), None)
    if hit is not None:
        raise InvalidArgument(f"workdir {workdir} is inside the hidden path {hit}")


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
_RUNTIMES_WITH_PROCESS_FILE = ("runc", "crun")


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
            dfd = fsat.open_dir(os.path.dirname(_record_path(name)))
            try:
                fsat.unlink_at(dfd, f"{name}.json")
            finally:
                os.close(dfd)


async def teardown(agent_id: str) -> list[str]:
    """Remove every container of this daemon labelled with `agent_id`; returns
    their names."""
    removed: list[str] = []
    for eng in _present_engines():
        names = [n for n, _ in await _list(eng, f"{LABEL_AGENT}={agent_id}")]
        await _remove(eng, names)
        removed += names
    unpin(agent_id)
    _remove_identity(agent_id)
    return removed


def _remove_identity(agent_id: str) -> None:
    # File by file, never a tree removal: nothing here may lead elsewhere.
    with contextlib.suppress(OSError, ValueError):
        containers = fsat.open_dir(os.path.join(runtime_dir(), "containers"))
        try:
            folder = fsat.open_dir_at(containers, agent_id)
            try:
                for name in _IDENTITY_FILES:
                    fsat.unlink_at(folder, name)
            finally:
                os.close(folder)
            fsat.rmdir_at(containers, agent_id)
        finally:
            os.close(containers)


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
    for sub, forget in (("pinned", unpin), ("", _remove_identity)):
        with contextlib.suppress(OSError):
            for entry in os.scandir(os.path.join(runtime_dir(), "containers", sub)):
                if entry.is_dir(follow_symlinks=False) and entry.name not in live | {"pinned"}:
                    forget(entry.name)
    return removed


def _tail(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " / ".join(lines[-3:]) if lines else "no output"
