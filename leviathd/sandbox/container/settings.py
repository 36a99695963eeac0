"""The container's settings, pure: its options, mounts, labels, identity files and
name, from the sandbox spec; and which daemon instance it belongs to."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from leviathd import fsat, resource_defaults
from leviathd.errors import InvalidArgument
from leviathd.paths import runtime_dir, state_dir
from leviathd.sandbox import engine as engines
from leviathd.sandbox import oci_seccomp
from leviathd.sandbox.spec import Mount, MountRole, SandboxSpec, is_within

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
_BIND_ROLES_SKIPPED = frozenset({MountRole.SYSTEM, MountRole.SCRATCH})
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
            if m.role in _BIND_ROLES_SKIPPED or is_within(m.source, spec.scratch):
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
    engine: engines.DetectedEngine,
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


def config_key(options: Iterable[str], image: str, engine: engines.DetectedEngine) -> str:
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
