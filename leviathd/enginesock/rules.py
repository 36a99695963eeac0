"""What an agent may ask of the container engine, and how its requests are
rewritten before they reach it.

Pure checks on the Docker Engine API's requests; what needs the engine (is
this container the agent's own?) or the file system (may it bind this path?)
is asked through the `Checks` protocol, which leviathd/enginesock/proxy.py
implements. Anything not matched here is refused (default deny).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode

from leviathd.enginesock import bodies, model, queries
from leviathd.enginesock.refused import Refused as Refused  # re-exported: rules.Refused

LABEL_AGENT = "org.leviath.engine-agent"
LABEL_DAEMON = "org.leviath.engine-daemon"
# Set on a container with writable host folders: who its processes and execs run as.
LABEL_USER = "org.leviath.engine-user"
RESERVED_LABEL_PREFIXES = ("org.leviath.", "io.podman.", "io.containers.")

DEFAULT_NETWORKS = frozenset({"", "default", "bridge", "podman"})
# Sysctls the kernel keeps per network or IPC namespace (what Docker allows).
_NAMESPACED_SYSCTL = re.compile(r"^(net\.|kernel\.(msgmax|msgmnb|msgmni|sem|shmall|shmmax|"
                                r"shmmni|shm_rmid_forced)$|fs\.mqueue\.)")
_BIND_OPTIONS = frozenset({"ro", "rw", "nocopy", "private", "rprivate", "slave", "rslave",
                           "nosuid", "nodev", "noexec", "delegated", "cached", "consistent"})
_PROPAGATION = frozenset({"", "private", "rprivate", "slave", "rslave"})
# The engine runs the log driver on the host as root: drivers that send to an
# address (the host's own loopback, any unix socket) and options naming a
# file (podman's path) are not the agent's to choose.
_LOG_DRIVERS = frozenset({"", "none", "json-file", "local", "k8s-file", "journald"})
_LOG_OPTIONS = frozenset({"max-size", "max-file", "compress"})
_VERSION = re.compile(r"^/v[0-9]{1,3}(\.[0-9]{1,3}){0,2}(?=/)")
_NAME = r"([A-Za-z0-9][A-Za-z0-9_.:@/-]{0,254}?)"
_ID = r"([A-Za-z0-9][A-Za-z0-9_.-]{0,254})"


class Checks(Protocol):
    agent_id: str
    cap_add: tuple[str, ...]
    publish_any: bool
    uid: int
    gid: int
    podman: bool
    daemon: str  # this daemon's instance (leviathd.sandbox.container.daemon_instance)
    cgroup_parent: str  # the agent's scope's control group, "" when not placed
    rootless: bool  # the engine is the user's rootless podman: container root is the user
    # The engine runs in a network namespace with only lo (the agent's network
    # is not `true`): a container's network could reach nothing, and podman
    # fails to set one up there.
    engine_offline: bool
    # network = "proxy": the engine runs in the agent's own network namespace
    # (only lo, the agent's proxy listening there). A container on the
    # default network shares that namespace (NetworkMode host of the engine,
    # which is the agent's, never the machine's) and gets these "NAME=value"
    # proxy settings: its only way out is the agent's egress. Empty otherwise.
    egress_env: tuple[str, ...]

    def parent_controllers(self) -> frozenset[str] | None:
        """What cgroup_parent passes to its children (cgroup v2), None: all."""
        ...

    async def container(self, ref: str) -> dict[str, Any]:
        """The agent's own container's inspect data, or Refused(404)."""
        ...

    async def network(self, ref: str) -> dict[str, Any]: ...

    async def volume(self, name: str, *, create: bool) -> dict[str, Any]: ...

    async def image(self, ref: str) -> dict[str, Any]: ...

    async def exec_container(self, exec_id: str) -> dict[str, Any]: ...

    async def bind(self, path: str, writable: bool) -> tuple[str, bool]:
        """(host path, read-only) or Refused."""
        ...


@dataclass
class Decision:
    """Forward `target` (the path with its query) with `body` (None: the
    client's body is streamed as it comes). `upgrade`: a hijacked stream."""

    target: str
    body: bytes | None = None
    upgrade: bool = False
    mutating: bool = False
    what: str = ""
    notes: list[str] = field(default_factory=list)


def split_version(path: str) -> tuple[str, str]:
    m = _VERSION.match(path)
    if m is None:
        return "", path
    return m.group(0), path[m.end():]


def _qs(query: str) -> list[tuple[str, str]]:
    try:
        return parse_qsl(query, keep_blank_values=True, max_num_fields=64,
                         strict_parsing=bool(query), errors="strict")
    except (ValueError, UnicodeDecodeError):
        raise Refused("the query string is malformed or has over 64 parameters", 400) from None


def _target(prefix: str, path: str, query: list[tuple[str, str]]) -> str:
    return prefix + path + ("?" + urlencode(query) if query else "")


def with_label_filter(query: list[tuple[str, str]], agent_id: str) -> list[tuple[str, str]]:
    """The query's `filters` with ours added: label filters are AND-ed, so the
    engine lists only what carries the agent's label, whatever else it asks."""
    filters: dict[str, Any] = {}
    rest = [(k, v) for k, v in query if k != "filters"]
    for k, v in query:
        if k == "filters" and v:
            try:
                parsed = json.loads(v)
            except ValueError:
                raise Refused("filters is not JSON", 400) from None
            if not isinstance(parsed, dict):
                raise Refused("filters is not a JSON object", 400)
            filters = parsed
    out: dict[str, list[str]] = {}
    for k, v in filters.items():
        if isinstance(v, dict):  # the old form {"label": {"a=b": true}}
            out[str(k)] = [str(x) for x, on in v.items() if on]
        elif isinstance(v, list):
            out[str(k)] = [str(x) for x in v]
        else:
            raise Refused("filters has a value that is neither a list nor a map", 400)
    out["label"] = [*out.get("label", []), f"{LABEL_AGENT}={agent_id}"]
    return [*rest, ("filters", json.dumps(out))]


def _labels(value: object, c: Checks, what: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    if value is not None:
        if not isinstance(value, dict):
            raise Refused(f"{what} labels are not a map", 400)
        for k, v in value.items():
            if any(str(k).startswith(p) for p in RESERVED_LABEL_PREFIXES):
                raise Refused(f"the label {str(k)[:100]!r} is reserved")
            labels[str(k)] = str(v)
    labels[LABEL_AGENT] = c.agent_id
    labels[LABEL_DAEMON] = c.daemon
    return labels


# The engine decodes a body as Go's encoding/json does: a key matches a field
# whatever its case ('privileged', 'hostConfig'; 'ſ' for 's' and the Kelvin
# sign for 'k' too), and a key given twice is decoded twice into the same
# field. The checks here read one exact spelling from one decoded dict, so a
# key the engine could read as one of them, spelt otherwise or repeated, is
# refused: the CLIs and compose send the API's own spelling, once.
_CHECKED_KEYS = model.field_names(bodies.CREATE, bodies.EXEC, bodies.EXEC_START,
                                  bodies.NETWORK_CREATE, bodies.NETWORK_CONNECT,
                                  bodies.VOLUME_CREATE)


def _go_fold(key: str) -> str:
    out = []
    for ch in key:
        folded = ch.lower() if ch.isascii() else ch.casefold()
        out.append(folded if len(folded) == 1 and folded.isascii() else ch)
    return "".join(out)


_CANONICAL: dict[str, frozenset[str]] = {}
for _k in _CHECKED_KEYS:
    _CANONICAL[_go_fold(_k)] = _CANONICAL.get(_go_fold(_k), frozenset()) | {_k}


# Fields that are maps (their keys are names, labels, options: any spelling
# is someone's data); their values are looked into all the same.
_MAP_FIELDS = frozenset({"Labels", "DriverOpts", "Options", "Sysctls", "Annotations",
                         "PortBindings", "ExposedPorts", "Volumes", "EndpointsConfig",
                         "StorageOpt", "Tmpfs", "Config"})


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise Refused(f"the key {key[:60]!r} is given twice", 400)
        out[key] = value
    return out


def _check_spelling(value: object, depth: int = 0, *, names: bool = False) -> None:
    if depth > 64:
        raise Refused("the request body is nested too deeply", 400)
    if isinstance(value, list):
        for item in value:
            _check_spelling(item, depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            want = None if names else _CANONICAL.get(_go_fold(key))
            if want is not None and key not in want:
                raise Refused(f"the key {key[:60]!r} is spelt {min(want)!r} in the engine's "
                              "API (the engine reads both as one)", 400)
            _check_spelling(item, depth + 1, names=not names and key in _MAP_FIELDS)


def _json_body(body: bytes | None) -> dict[str, Any]:
    if not body:
        return {}
    try:
        parsed = json.loads(body, object_pairs_hook=_no_repeats)
    except ValueError:
        raise Refused("the request body is not JSON", 400) from None
    if not isinstance(parsed, dict):
        raise Refused("the request body is not a JSON object", 400)
    _check_spelling(parsed)
    return parsed


def _dump(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _norm_cap(cap: object) -> str:
    return str(cap).strip().upper().removeprefix("CAP_")


# ------------------------------------------------------------ container create


async def check_create(body: dict[str, Any], c: Checks) -> dict[str, Any]:
    """The create request as it may reach the engine (Refused otherwise)."""
    host = body.get("HostConfig") or {}
    if not isinstance(host, dict):
        raise Refused("HostConfig is not an object", 400)
    if host.get("Privileged"):
        raise Refused("privileged containers are not allowed: they are root on the host")
    for cap in host.get("CapAdd") or []:
        name = _norm_cap(cap)
        if name == "ALL" or name not in c.cap_add:
            raise Refused(f"--cap-add {name[:40]} is not allowed: the configuration allows "
                          f"{', '.join(c.cap_add) or 'none'} ([sandbox.containers] cap_add)")
    if host.get("Devices") or host.get("DeviceRequests") or host.get("DeviceCgroupRules"):
        raise Refused("devices and GPUs are not allowed: a device node is the host's hardware")
    for key, flag in (("PidMode", "--pid"), ("IpcMode", "--ipc"), ("UTSMode", "--uts"),
                      ("UsernsMode", "--userns"), ("CgroupnsMode", "--cgroupns"),
                      ("Cgroup", "--cgroup")):
        mode = str(host.get(key) or "")
        if mode == "host":
            raise Refused(f"{flag}=host is not allowed: the host's namespaces are the host")
        if mode.startswith("container:"):
            found = await c.container(mode.removeprefix("container:"))
            host[key] = "container:" + str(found.get("Id", ""))
        elif mode.startswith(("ns:", "/")):
            raise Refused(f"{flag}={mode[:100]} is not allowed: only the container's own "
                          "namespaces or its own containers'")
        elif key in ("UsernsMode", "Cgroup") and mode:
            raise Refused(f"{flag}={mode[:100]} is not allowed")
    await _check_network_mode(host, c)
    if c.engine_offline:
        _offline_network(host, body, c.egress_env)
    _check_security_opts(host.get("SecurityOpt") or [])
    if host.get("CgroupParent"):
        raise Refused("--cgroup-parent is not allowed: the daemon places containers")
    if c.cgroup_parent:
        # Under the agent's scope: `lev stop` kills what runs there, and the
        # agent's memory, tasks and CPU limits hold over it.
        host["CgroupParent"] = c.cgroup_parent
        _drop_limits_the_parent_cannot_take(host, c.parent_controllers())
    for name in (host.get("Sysctls") or {}):
        if not _NAMESPACED_SYSCTL.match(str(name)):
            raise Refused(f"--sysctl {str(name)[:80]} is not allowed: it is not per container")
        if str(name).startswith("net.") and str(host.get("NetworkMode") or "") == "host":
            raise Refused("net.* sysctls need the container's own network")
    runtime = str(host.get("Runtime") or "")
    if runtime not in ("", "runc", "crun"):
        raise Refused(f"--runtime {runtime[:80]} is not allowed: only the engine's default")
    if host.get("MaskedPaths") is not None or host.get("ReadonlyPaths") is not None:
        raise Refused("systempaths=unconfined is not allowed: it shows the host's /proc and /sys")
    if host.get("Annotations"):
        raise Refused("annotations are not allowed: they change how the runtime builds the "
                      "container")
    _check_log_config(host.get("LogConfig"))
    if c.podman and not (host.get("LogConfig") or {}).get("Type"):
        # Podman's own default is journald where it was built with systemd,
        # and reading it back dlopens libsystemd-journal, which Debian 13 no
        # longer ships: `docker logs` answered 500 there (issue 49). Its
        # file driver works everywhere, and the file is the engine's own.
        host["LogConfig"] = {**(host.get("LogConfig") or {}), "Type": "k8s-file"}
    if host.get("VolumeDriver") not in (None, "", "local"):
        raise Refused("volume drivers other than local are not allowed")
    if isinstance(host.get("OomScoreAdj"), int) and host["OomScoreAdj"] < 0:
        raise Refused("a negative --oom-score-adj is not allowed: the host's memory comes first")
    for ref in host.get("Links") or []:
        name, _, alias = str(ref).partition(":")
        found = await c.container(name)
        host["Links"] = [x for x in host["Links"] if x != ref] + [
            f"{str(found.get('Name', name)).lstrip('/')}:{alias or name}"]
    writable, anonymous = await _check_mounts(host, c)
    _check_ports(host, c)
    _check_restart(host.get("RestartPolicy"))
    config = body
    # Podman's compat layer turns a Volumes key with a colon into a bind
    # (`{"/:/host": {}}` bound the host's root): only plain targets pass.
    volumes: dict[str, Any] = {_target_path(t): {} for t in (config.get("Volumes") or {})}
    config["Volumes"] = {**volumes, **anonymous} or None
    for port in config.get("ExposedPorts") or {}:
        _port_key(str(port))
    await _check_healthcheck(config, c)
    for ep in ((config.get("NetworkingConfig") or {}).get("EndpointsConfig") or {}).values():
        _check_aliases(ep)
    config["Labels"] = _labels(config.get("Labels"), c, "container")
    if writable:
        # Root in the container is root on the host for the files of a host
        # folder: a setuid-root file written into the worktree would be the
        # user's root shell. So such a container runs as the agent's user,
        # with no way back up to root.
        user = str(config.get("User") or "")
        # Rootless, the container's root is the agent's user on the host (its
        # uid 1000 a subordinate id that could not even write the folder).
        want = "0:0" if c.rootless else f"{c.uid}:{c.gid}"
        if user not in ("", want, str(c.uid)):
            raise Refused(f"a container with writable host folders runs as your user: "
                          f"--user {want}, not {user[:40]!r}")
        if host.get("GroupAdd"):
            raise Refused("--group-add is not allowed with writable host folders")
        if host.get("CapAdd"):
            raise Refused("--cap-add is not allowed with writable host folders")
        config["User"] = want
        opts = [str(o) for o in host.get("SecurityOpt") or []]
        host["SecurityOpt"] = [*opts, "no-new-privileges"]
        config["Labels"][LABEL_USER] = want
    config["HostConfig"] = host
    return config


# HostConfig's limits and the cgroup v2 controller each one writes.
_LIMIT_CONTROLLERS = {
    "Memory": "memory", "MemorySwap": "memory", "MemoryReservation": "memory",
    "KernelMemory": "memory", "PidsLimit": "pids", "NanoCpus": "cpu", "CpuQuota": "cpu",
    "CpuPeriod": "cpu", "CpuShares": "cpu", "CpuRealtimePeriod": "cpu",
    "CpuRealtimeRuntime": "cpu", "CpusetCpus": "cpuset", "CpusetMems": "cpuset",
    "BlkioWeight": "io", "BlkioWeightDevice": "io", "BlkioDeviceReadBps": "io",
    "BlkioDeviceWriteBps": "io", "BlkioDeviceReadIOps": "io", "BlkioDeviceWriteIOps": "io",
}


def _drop_limits_the_parent_cannot_take(host: dict[str, Any],
                                        enabled: frozenset[str] | None) -> None:
    """On pure cgroup v2 the agent's scope holds processes (its supervisor),
    so it can never pass a controller to its children (the no-internal-process
    rule), and the runtime fails to write a limit there: such a limit is left
    out. Nothing is lost: the scope's own limits hold over the container."""
    if enabled is None:
        return
    for name, controller in _LIMIT_CONTROLLERS.items():
        if controller not in enabled and host.get(name):
            host.pop(name, None)


async def _check_network_mode(host: dict[str, Any], c: Checks) -> None:
    mode = str(host.get("NetworkMode") or "")
    if mode == "host":
        raise Refused("--network host is not allowed: the host's network namespace is the host's")
    if mode.startswith("container:"):
        found = await c.container(mode.removeprefix("container:"))
        host["NetworkMode"] = "container:" + str(found.get("Id", ""))
    elif mode in DEFAULT_NETWORKS or mode in ("none", "private", "slirp4netns", "pasta"):
        pass
    elif ":" in mode or mode.startswith("/"):
        raise Refused(f"--network {mode[:100]} is not allowed")
    else:
        await c.network(mode)


_NO_ENGINE_NETWORK = ("the agent's container engine has no network: it runs in a network "
                      "namespace with only lo, since the agent's [sandbox] network is not true")


_AGENT_NETWORK = ("the agent's containers share its network namespace (network = \"proxy\": "
                  "only lo, out through the agent's proxy)")


def _offline_network(host: dict[str, Any], body: dict[str, Any],
                     egress_env: tuple[str, ...]) -> None:
    """On an engine without a network, a container on the default network
    gets `none`: the same reach (nothing), and `docker run IMAGE cmd` runs
    where podman would fail to make the network (slirp4netns, pasta, its
    rootless netns). Behind the proxy (`egress_env`) it gets the agent's own
    network namespace instead, and the agent's proxy settings: the same
    reach as the agent's, and no route of its own (slirp4netns and pasta
    would give it one, so they are taken the same way). What needs a
    network of its own is refused saying why."""
    mode = str(host.get("NetworkMode") or "")
    endpoints = (body.get("NetworkingConfig") or {}).get("EndpointsConfig") or {}
    named = [str(n) for n in endpoints if str(n) not in DEFAULT_NETWORKS and str(n) != "none"]
    why = _AGENT_NETWORK if egress_env else _NO_ENGINE_NETWORK
    if named or (mode not in DEFAULT_NETWORKS and mode not in ("none", "private")
                 and not mode.startswith("container:")
                 and mode not in ("slirp4netns", "pasta")):
        raise Refused(f"the network {(named or [mode])[0][:60]} cannot carry a container here: "
                      f"{why}; run it on the default network (compose: network_mode: "
                      f"{'default' if egress_env else 'none'})")
    shared = (*DEFAULT_NETWORKS, "private", *(("slirp4netns", "pasta") if egress_env else ()))
    if mode not in shared:
        return
    if host.get("PortBindings") or host.get("PublishAllPorts"):
        if egress_env:
            raise Refused(f"publishing a port is not possible here: {why}; a port a container "
                          "listens on is the agent's own 127.0.0.1:PORT, without -p")
        raise Refused(f"publishing a port needs the container's network: {why}")
    if egress_env:
        host["NetworkMode"] = "host"
        body["Env"] = _with_env(body.get("Env"), egress_env)
    else:
        host["NetworkMode"] = "none"
    if body.get("NetworkingConfig") is not None:
        body["NetworkingConfig"] = None


def _with_env(env: object, extra: tuple[str, ...]) -> list[str]:
    """`env` (Config.Env) with each of `extra` whose name it does not set
    already: what the user gave (`-e http_proxy=`) is hers to keep."""
    have = [str(e) for e in env] if isinstance(env, list) else []
    names = {e.partition("=")[0] for e in have}
    return have + [e for e in extra if e.partition("=")[0] not in names]


async def check_endpoints(body: dict[str, Any], c: Checks) -> None:
    net = body.get("NetworkingConfig") or {}
    endpoints = net.get("EndpointsConfig") if isinstance(net, dict) else None
    for name in endpoints or {}:
        if str(name) == "host":
            raise Refused("--network host is not allowed: the host's network namespace is the "
                          "host's")
        if str(name) not in DEFAULT_NETWORKS and str(name) != "none":
            await c.network(str(name))


def _check_log_config(log: object) -> None:
    if log is None:
        return
    if not isinstance(log, dict):
        raise Refused("LogConfig is not an object", 400)
    kind = str(log.get("Type") or "")
    if kind not in _LOG_DRIVERS:
        raise Refused(f"--log-driver {kind[:40]} is not allowed: the engine would send the "
                      "logs from the host (json-file, local, k8s-file, journald or none)")
    opts = log.get("Config") or {}
    if not isinstance(opts, dict):
        raise Refused("LogConfig.Config is not a map", 400)
    for name in opts:
        if str(name) not in _LOG_OPTIONS:
            raise Refused(f"--log-opt {str(name)[:40]} is not allowed: only "
                          f"{', '.join(sorted(_LOG_OPTIONS))}")


def _check_security_opts(opts: list[object]) -> None:
    for opt in opts:
        text = str(opt)
        key = re.split("[=:]", text, maxsplit=1)[0]
        if key == "no-new-privileges":
            value = text[len(key) + 1:] if len(text) > len(key) else "true"
            if value in ("true", ""):
                continue
        raise Refused(f"--security-opt {text[:80]} is not allowed: seccomp, AppArmor and SELinux "
                      "stay as the engine sets them")


async def _check_mounts(host: dict[str, Any], c: Checks) -> tuple[bool, dict[str, Any]]:
    """Checks and rewrites Binds, Mounts, Tmpfs and VolumesFrom; (True when a
    host folder is bound writable, the anonymous volumes Mounts asked for)."""
    writable = False
    binds: list[str] = []
    for spec in host.get("Binds") or []:
        parts = str(spec).split(":")
        if len(parts) < 2 or len(parts) > 3:
            raise Refused(f"bind {str(spec)[:200]!r} is not SOURCE:TARGET[:OPTIONS]", 400)
        source, target = parts[0], _target_path(parts[1])
        opts = [o for o in (parts[2].split(",") if len(parts) == 3 else []) if o]
        for o in opts:
            if o not in _BIND_OPTIONS:
                raise Refused(f"bind option {o[:40]!r} is not allowed (z, Z and U change the "
                              "host's files; shared propagation reaches the host)")
        want_rw = "ro" not in opts
        if source.startswith("/"):
            real, ro = await c.bind(source, want_rw)
            opts = [o for o in opts if o not in ("ro", "rw")] + (["ro"] if ro else ["rw"])
            if c.podman:
                opts = [o for o in opts if o not in ("nosuid", "nodev")] + ["nosuid", "nodev"]
            writable = writable or not ro
            binds.append(f"{real}:{target}:{','.join(opts)}")
        else:
            await c.volume(_volume_name(source), create=True)
            binds.append(f"{source}:{target}" + (f":{','.join(opts)}" if opts else ""))
    # One normalised form: every bind and named volume as a Binds string of
    # checked parts, tmpfs in HostConfig.Tmpfs, anonymous volumes in
    # Config.Volumes; HostConfig.Mounts never reaches the engine (podman
    # formats a Mount's fields into its own --mount option string).
    tmpfs: dict[str, str] = {}
    for target, options in (host.get("Tmpfs") or {}).items():
        tmpfs[_target_path(target)] = _tmpfs_options(str(options))
    anonymous: dict[str, Any] = {}
    for m in host.get("Mounts") or []:
        if not isinstance(m, dict):
            raise Refused("a mount is not an object", 400)
        kind = str(m.get("Type") or "volume")
        if kind == "bind":
            bopts = m.get("BindOptions") or {}
            if not isinstance(bopts, dict):
                raise Refused("BindOptions is not an object", 400)
            if str(bopts.get("Propagation") or "") not in _PROPAGATION:
                raise Refused("shared mount propagation is not allowed: it reaches the host")
            if bopts.get("NonRecursive") or bopts.get("ReadOnlyNonRecursive"):
                raise Refused("non-recursive binds are not allowed: they would show what a "
                              "read-only mount covers")
            real, ro = await c.bind(str(m.get("Source") or ""), not m.get("ReadOnly"))
            writable = writable or not ro
            # As a bind string, so that one path adds nosuid/nodev.
            flags = ["ro" if ro else "rw"] + (["nosuid", "nodev"] if c.podman else [])
            binds.append(f"{real}:{_target_path(m.get('Target'))}:{','.join(flags)}")
        elif kind == "volume":
            vo = m.get("VolumeOptions") or {}
            target = _target_path(m.get("Target"))
            flags = (["ro"] if m.get("ReadOnly") else []) + (["nocopy"] if vo.get("NoCopy")
                                                             else [])
            if m.get("Source"):
                name = _volume_name(str(m["Source"]))
                await c.volume(name, create=True)
                binds.append(f"{name}:{target}" + (f":{','.join(flags)}" if flags else ""))
            elif flags:
                raise Refused("an anonymous volume mount takes no options", 400)
            else:
                anonymous[target] = {}
        elif kind == "tmpfs":
            to = m.get("TmpfsOptions") or {}
            opts = (["ro"] if m.get("ReadOnly") else [])
            if to.get("SizeBytes"):
                opts.append(f"size={int(to['SizeBytes'])}")
            if to.get("Mode"):
                opts.append(f"mode={int(to['Mode']):o}")
            tmpfs[_target_path(m.get("Target"))] = ",".join(opts)
        else:
            raise Refused(f"mounts of type {kind[:40]} are not allowed")
    host["Binds"] = binds or None
    host["Mounts"] = None
    host["Tmpfs"] = tmpfs or None
    vfrom: list[str] = []
    for ref in host.get("VolumesFrom") or []:
        name, _, mode = str(ref).partition(":")
        # Podman reads a comma list here: `rw` anywhere in it makes read-only
        # mounts writable, `z` relabels their host files.
        if mode not in ("", "ro"):
            raise Refused(f"--volumes-from NAME:{mode[:40]} is not allowed: only ro (rw would "
                          "make read-only mounts writable, z relabels the host's files)")
        found = await c.container(name)
        labels = (found.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_USER):
            writable = True
        vfrom.append(str(found.get("Id", "")) + (f":{mode}" if mode else ""))
    host["VolumesFrom"] = vfrom or None
    return writable, anonymous


_VOLUME_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}\Z")
_ALIAS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}\Z")
_TMPFS_OPTION = re.compile(r"^(ro|rw|nosuid|nodev|noexec|exec|suid|dev|notmpcopyup|tmpcopyup|"
                           r"(size=[0-9]{1,15}[kmgKMG%]?)|(mode=[0-7]{1,4})|(nr_inodes=[0-9]{1,15}"
                           r"[kmgKMG]?)|(uid=[0-9]{1,10})|(gid=[0-9]{1,10}))\Z")


def _volume_name(name: str) -> str:
    """A named volume, as the engine's name rule (no path, option or colon)."""
    if not _VOLUME_NAME.match(name):
        raise Refused(f"volume name {name[:100]!r} is not a plain name", 400)
    return name


def _tmpfs_options(text: str) -> str:
    opts = [o for o in text.split(",") if o]
    for o in opts:
        if not _TMPFS_OPTION.match(o):
            raise Refused(f"tmpfs option {o[:60]!r} is not allowed (size, mode, nr_inodes, "
                          "uid, gid and the mount flags)", 400)
    return ",".join(opts)


def _check_aliases(endpoint: dict[str, Any]) -> None:
    for key in ("Aliases", "DNSNames"):
        for alias in endpoint.get(key) or []:
            if not _ALIAS.match(str(alias)):
                raise Refused(f"network alias {str(alias)[:100]!r} is not a plain name", 400)


def _target_path(value: object) -> str:
    text = str(value or "")
    if not text.startswith("/") or any(ch in text for ch in ":,\0"):
        raise Refused(f"mount target {text[:200]!r} is not an absolute path", 400)
    return text


_PORT_KEY = re.compile(r"^([0-9]{1,5})(-([0-9]{1,5}))?(/(tcp|udp|sctp))?\Z")
_HOST_PORT = re.compile(r"^(([0-9]{1,5})(-([0-9]{1,5}))?)?\Z")
# Below this a port is the host's (privileged): never the agent's to take.
MIN_HOST_PORT = 1024
# A healthcheck runs a process in the container each interval, started by the
# engine's timers: an agent's 1 s would cost the machine, not the agent.
MIN_HEALTH_INTERVAL_NS = 10 * 1_000_000_000
_RESTART = frozenset({"", "no", "always", "unless-stopped", "on-failure"})


def _port_key(key: str) -> None:
    m = _PORT_KEY.match(key)
    if m is None or int(m.group(1)) > 65535 or int(m.group(3) or 0) > 65535:
        raise Refused(f"port {key[:40]!r} is not PORT[-PORT][/tcp|udp|sctp]", 400)


def _check_restart(policy: object) -> None:
    if isinstance(policy, dict) and str(policy.get("Name") or "") not in _RESTART:
        raise Refused(f"restart policy {str(policy.get('Name'))[:40]!r} is not one of "
                      "no, always, unless-stopped, on-failure", 400)


async def _check_healthcheck(config: dict[str, Any], c: Checks) -> None:
    """Intervals below the floor are raised to it, the image's own as well
    (a HEALTHCHECK the agent built into an image applies when the create
    names none)."""
    check = config.get("Healthcheck")
    if check is None:
        try:
            image = await c.image(str(config.get("Image") or ""))
        except Refused:
            return  # no such image: the engine says so (and the CLI pulls)
        inherited = (image.get("Config") or {}).get("Healthcheck")
        if not isinstance(inherited, dict):
            return
        check = model.rebuild({k: v for k, v in inherited.items()
                               if k in bodies.HEALTHCHECK.fields}, bodies.HEALTHCHECK)
        if not check or (check.get("Test") or [""])[0] == "NONE":
            return
        if all(k not in check for k in ("Interval", "StartInterval")) or all(
                check.get(k, MIN_HEALTH_INTERVAL_NS) >= MIN_HEALTH_INTERVAL_NS
                for k in ("Interval", "StartInterval")):
            return
    for key in ("Interval", "StartInterval"):
        value = check.get(key)
        if isinstance(value, int) and 0 < value < MIN_HEALTH_INTERVAL_NS:
            check[key] = MIN_HEALTH_INTERVAL_NS
        elif isinstance(value, int) and value < 0:
            raise Refused(f"Healthcheck.{key} is negative", 400)
    config["Healthcheck"] = check


def _check_ports(host: dict[str, Any], c: Checks) -> None:
    for key, bindings in (host.get("PortBindings") or {}).items():
        _port_key(str(key))
        for b in bindings or []:
            port = str((b or {}).get("HostPort") or "")
            m = _HOST_PORT.match(port)
            if m is None or any(int(x) > 65535 for x in (m.group(2) or "0", m.group(4) or "0")):
                raise Refused(f"host port {port[:40]!r} is not PORT[-PORT]", 400)
            low = int(m.group(2) or 0)
            if m.group(2) is not None and low < MIN_HOST_PORT:
                raise Refused(f"host port {low} is below {MIN_HOST_PORT}: ports below it are "
                              "the host's own services'")
    if c.publish_any:
        return
    if host.get("PublishAllPorts"):
        raise Refused("-P binds every port on all addresses; publish each with "
                      "-p 127.0.0.1::PORT ([sandbox.containers] publish = \"loopback\")")
    ports = host.get("PortBindings") or {}
    if not isinstance(ports, dict):
        raise Refused("PortBindings is not a map", 400)
    for key, bindings in ports.items():
        for b in bindings or []:
            if not isinstance(b, dict):
                raise Refused("a port binding is not an object", 400)
            ip = str(b.get("HostIp") or "")
            if ip in ("", "127.0.0.1", "localhost"):
                b["HostIp"] = "127.0.0.1"
            else:
                raise Refused(f"publishing {str(key)[:40]} on {ip[:60]} is not allowed: ports "
                              "bind 127.0.0.1 ([sandbox.containers] publish = \"loopback\")")


# ------------------------------------------------------------------- routing

# Requests whose JSON body the rules read (bounded, whole) before deciding.
JSON_BODY = (
    ("POST", re.compile(r"^/containers/create$")),
    ("POST", re.compile(r"^/containers/[^/]+/exec$")),
    ("POST", re.compile(r"^/networks/create$")),
    ("POST", re.compile(r"^/networks/[^/]+/(connect|disconnect)$")),
    ("POST", re.compile(r"^/volumes/create$")),
    ("POST", re.compile(r"^/exec/[^/]+/start$")),
)


def wants_json_body(method: str, path: str) -> bool:
    _prefix, rest = split_version(path)
    return any(method == m and p.match(rest) for m, p in JSON_BODY)


_CONTAINER_OPS = {
    ("GET", "json"), ("GET", "top"), ("GET", "logs"), ("GET", "changes"), ("GET", "export"),
    ("GET", "stats"), ("POST", "resize"), ("POST", "start"), ("POST", "stop"),
    ("POST", "restart"), ("POST", "kill"), ("POST", "pause"), ("POST", "unpause"),
    ("POST", "attach"), ("GET", "attach/ws"), ("POST", "wait"), ("POST", "rename"),
    ("HEAD", "archive"), ("GET", "archive"), ("PUT", "archive"), ("POST", "exec"),
}
_MUTATING_OPS = {"start", "stop", "restart", "kill", "pause", "unpause", "rename", "archive",
                 "exec"}


async def decide(method: str, path: str, query: str, body: bytes | None, c: Checks) -> Decision:
    """Raises Refused; never forwards what it does not know."""
    prefix, rest = split_version(path)
    if prefix and tuple(int(x) for x in prefix[2:].split(".")[:2]) < (1, 24):
        # Before 1.24 Docker applies a HostConfig sent with a container's
        # start, a body the rules do not read.
        raise Refused(f"API version {prefix[2:]} is refused: 1.24 or later")
    if "/./" in rest + "/" or "/../" in rest + "/" or "//" in rest or "%" in rest:
        # The engine's router would clean such a path into another endpoint
        # than the one the rules matched.
        raise Refused(f"the path {rest[:120]!r} is not in its plain form", 400)
    q = _qs(query)
    if rest.startswith("/libpod/"):
        return _libpod(method, prefix, rest, q, c)
    if method in ("GET", "HEAD") and rest in ("/_ping", "/version", "/info"):
        return Decision(_target(prefix, rest, queries.rebuild("info", q)))
    if rest == "/containers/json" and method == "GET":
        q = queries.rebuild("containers/json", q)
        return Decision(_target(prefix, rest, with_label_filter(q, c.agent_id)))
    if rest == "/containers/create" and method == "POST":
        q = queries.rebuild("containers/create", q)
        create = model.rebuild(_json_body(body), bodies.CREATE)
        await check_endpoints(create, c)
        out = model.rebuild(await check_create(create, c), bodies.CREATE)
        return Decision(_target(prefix, rest, q), _dump(out), mutating=True,
                        what="container create")
    if rest == "/containers/prune" and method == "POST":
        q = queries.rebuild("containers/prune", q)
        return Decision(_target(prefix, rest, with_label_filter(q, c.agent_id)), mutating=True,
                        what="container prune")
    m = re.match(r"^/containers/" + _ID + r"(/(.*))?$", rest)
    if m is not None:
        return await _container_op(method, prefix, m, q, body, c)
    m = re.match(r"^/exec/" + _ID + r"/(start|resize|json)$", rest)
    if m is not None:
        found = await c.exec_container(m.group(1))
        q = queries.rebuild("exec/" + m.group(2), q)
        if (method, m.group(2)) == ("POST", "start"):
            start = model.rebuild(_json_body(body), bodies.EXEC_START)
            # A detached start is answered as a plain request, not a stream:
            # raw bytes behind it would be read as the next request.
            return Decision(_target(prefix, rest, q), _dump(start) if body else body,
                            upgrade=not start.get("Detach"), mutating=True,
                            what=f"exec start in {str(found.get('Id', ''))[:12]}")
        if (method, m.group(2)) in (("POST", "resize"), ("GET", "json")):
            return Decision(_target(prefix, rest, q))
    if rest.startswith("/networks"):
        return await _network_op(method, prefix, rest, q, body, c)
    if rest.startswith("/volumes"):
        return await _volume_op(method, prefix, rest, q, body, c)
    if rest.startswith(("/images", "/build", "/distribution")):
        return await _image_op(method, prefix, rest, q, c)
    if rest == "/events" and method == "GET":
        q = queries.rebuild("events", q)
        return Decision(_target(prefix, rest, with_label_filter(q, c.agent_id)))
    for name in ("swarm", "services", "secrets", "configs", "plugins", "nodes", "tasks"):
        if rest.startswith(f"/{name}"):
            raise Refused(f"{name} are not allowed: they act for the whole machine's engine")
    raise Refused(f"{method} {rest[:120]} is not an endpoint the filtered socket knows, so it "
                  "is refused")


def _libpod(method: str, prefix: str, rest: str, q: list[tuple[str, str]],
            c: Checks) -> Decision:
    """`podman --remote`: its ping, version and lists pass (the same allow-lists,
    the agent's label added); everything else of libpod is refused. Its
    container create takes podman's SpecGenerator, a body of other fields
    and namespaces than the Docker API's, which no model here rebuilds."""
    if not c.podman:
        raise Refused("podman's own API (libpod) is refused: the engine is not podman")
    if method in ("GET", "HEAD") and rest in ("/libpod/_ping", "/libpod/version"):
        # `podman --remote version`: the engine's version, as /version is.
        return Decision(_target(prefix, rest, queries.rebuild("info", q)))
    if method == "GET" and rest == "/libpod/containers/json":
        q = queries.rebuild("libpod/containers/json", q)
        return Decision(_target(prefix, rest, with_label_filter(q, c.agent_id)))
    if method == "GET" and rest == "/libpod/images/json":
        return Decision(_target(prefix, rest, queries.rebuild("libpod/images/json", q)))
    raise Refused(f"{method} {rest[:120]} of podman's own API (libpod) is not filtered, so it "
                  "is refused: podman --remote can list (ps, images); to run, build or pull, "
                  "use the docker CLI or compose on the Docker-compatible API ($DOCKER_HOST)")


async def _container_op(
    method: str, prefix: str, m: re.Match[str], q: list[tuple[str, str]], body: bytes | None,
    c: Checks,
) -> Decision:
    found = await c.container(m.group(1))
    cid = str(found.get("Id", ""))
    op = m.group(3) or ""
    if op == "" and method == "GET":
        raise Refused("not found", 404)
    if op == "" and method == "DELETE":
        q = queries.rebuild("containers/delete", q)
        return Decision(_target(prefix, f"/containers/{cid}", q), mutating=True,
                        what=f"container remove {cid[:12]}")
    if (op == "json" and method == "GET") or (method, op) in _CONTAINER_OPS:
        q = queries.rebuild("containers/json-one" if op == "json" else f"containers/{op}", q)
        labels = (found.get("Config") or {}).get("Labels") or {}
        user = labels.get(LABEL_USER)
        new_body = body
        if op == "exec":
            ex = model.rebuild(_json_body(body), bodies.EXEC)
            if ex.get("Privileged"):
                raise Refused("privileged exec is not allowed: it is root on the host")
            if user:
                asked = str(ex.get("User") or "")
                if asked not in ("", user, user.split(":")[0]):
                    raise Refused(f"this container has writable host folders: exec runs as "
                                  f"{user}, not {asked[:40]!r}")
                ex["User"] = user
            new_body = _dump(model.rebuild(ex, bodies.EXEC))
        if op == "archive" and method == "PUT" and user:
            raise Refused("copying into a container with writable host folders is not "
                          "allowed: the engine writes as root")
        return Decision(
            _target(prefix, f"/containers/{cid}/{op}", q), new_body,
            upgrade=op == "attach", mutating=op in _MUTATING_OPS,
            what=f"container {op} {cid[:12]}",
        )
    raise Refused(f"{method} /containers/ID/{op[:60]} is not an endpoint the filtered socket "
                  "knows, so it is refused")


async def _network_op(
    method: str, prefix: str, rest: str, q: list[tuple[str, str]], body: bytes | None,
    c: Checks,
) -> Decision:
    if rest == "/networks" and method == "GET":
        q = queries.rebuild("networks/list", q)
        return Decision(_target(prefix, rest, with_label_filter(q, c.agent_id)))
    if rest == "/networks/prune" and method == "POST":
        q = queries.rebuild("networks/prune", q)
        return Decision(_target(prefix, rest, with_label_filter(q, c.agent_id)), mutating=True,
                        what="network prune")
    if rest == "/networks/create" and method == "POST":
        q = queries.rebuild("networks/create", q)
        net = model.rebuild(_json_body(body), bodies.NETWORK_CREATE)
        if str((net.get("IPAM") or {}).get("Driver") or "default") != "default":
            raise Refused("IPAM drivers other than the default are not allowed")
        if str(net.get("Driver") or "bridge") != "bridge":
            raise Refused(f"network driver {str(net.get('Driver'))[:40]} is not allowed: only "
                          "bridge (others reach the host's interfaces)")
        if net.get("ConfigFrom") or net.get("ConfigOnly") or net.get("Ingress") or net.get(
                "Scope") not in (None, "", "local"):
            raise Refused("swarm and config-only networks are not allowed")
        net["Labels"] = _labels(net.get("Labels"), c, "network")
        net = model.rebuild(net, bodies.NETWORK_CREATE)
        return Decision(_target(prefix, rest, q), _dump(net), mutating=True,
                        what=f"network create {str(net.get('Name'))[:64]}")
    m = re.match(r"^/networks/" + _ID + r"(/(connect|disconnect))?$", rest)
    if m is None:
        raise Refused(f"{method} {rest[:120]} is not allowed")
    found = await c.network(m.group(1))
    nid = str(found.get("Id") or found.get("ID") or "")
    op = m.group(3)
    if op is None and method == "GET":
        q = queries.rebuild("networks/one", q)
        return Decision(_target(prefix, f"/networks/{nid}", q))
    if op is None and method == "DELETE":
        q = queries.rebuild("networks/delete", q)
        return Decision(_target(prefix, f"/networks/{nid}", q), mutating=True,
                        what=f"network remove {nid[:12]}")
    if op is not None and method == "POST":
        q = queries.rebuild(f"networks/{op}", q)
        req = model.rebuild(_json_body(body), bodies.NETWORK_CONNECT)
        own = await c.container(str(req.get("Container") or ""))
        req["Container"] = str(own.get("Id", ""))
        endpoint = req.get("EndpointConfig")
        if endpoint is not None:  # (the network itself is the agent's: looked up above)
            _check_aliases(endpoint)
        req = model.rebuild(req, bodies.NETWORK_CONNECT)
        return Decision(_target(prefix, f"/networks/{nid}/{op}", q), _dump(req), mutating=True,
                        what=f"network {op} {nid[:12]}")
    raise Refused(f"{method} {rest[:120]} is not allowed")


async def _volume_op(
    method: str, prefix: str, rest: str, q: list[tuple[str, str]], body: bytes | None,
    c: Checks,
) -> Decision:
    if rest == "/volumes" and method == "GET":
        q = queries.rebuild("volumes/list", q)
        return Decision(_target(prefix, rest, with_label_filter(q, c.agent_id)))
    if rest == "/volumes/prune" and method == "POST":
        q = queries.rebuild("volumes/prune", q)
        return Decision(_target(prefix, rest, with_label_filter(q, c.agent_id)), mutating=True,
                        what="volume prune")
    if rest == "/volumes/create" and method == "POST":
        q = queries.rebuild("volumes/create", q)
        vol = model.rebuild(_json_body(body), bodies.VOLUME_CREATE)
        if vol.get("Name") is not None:
            _volume_name(str(vol["Name"]))
        if str(vol.get("Driver") or "local") != "local" or vol.get("DriverOpts"):
            raise Refused("volume drivers and driver options are not allowed (a volume that "
                          "binds a folder would bypass the bind checks)")
        vol["Labels"] = _labels(vol.get("Labels"), c, "volume")
        vol = model.rebuild(vol, bodies.VOLUME_CREATE)
        return Decision(_target(prefix, rest, q), _dump(vol), mutating=True,
                        what=f"volume create {str(vol.get('Name'))[:64]}")
    m = re.match(r"^/volumes/" + _ID + "$", rest)
    if m is not None and method in ("GET", "DELETE"):
        q = queries.rebuild("volumes/one" if method == "GET" else "volumes/delete", q)
        found = await c.volume(m.group(1), create=False)
        name = str(found.get("Name", ""))
        return Decision(_target(prefix, f"/volumes/{name}", q), mutating=method == "DELETE",
                        what=f"volume remove {name[:64]}")
    raise Refused(f"{method} {rest[:120]} is not allowed")


async def _image_op(
    method: str, prefix: str, rest: str, q: list[tuple[str, str]], c: Checks
) -> Decision:
    if rest == "/images/json" and method == "GET":
        return Decision(_target(prefix, rest, queries.rebuild("images/json", q)))
    if rest == "/images/create" and method == "POST":
        q = queries.rebuild("images/create", q)
        return Decision(_target(prefix, rest, q), mutating=True, what="image pull")
    if rest == "/build" and method == "POST":
        for k, v in q:
            if k == "remote":
                raise Refused("a build context from a URL is not allowed")
            if k == "cgroupparent" and v:
                raise Refused("--cgroup-parent is not allowed: the daemon places containers")
        q = queries.rebuild("build", q)
        labels: dict[str, str] = {}
        for k, v in q:
            if k == "labels" and v:
                try:
                    labels = json.loads(v)
                except ValueError:
                    raise Refused("labels is not JSON", 400) from None
        q = [(k, v) for k, v in q if k != "labels"]
        q.append(("labels", json.dumps(_labels(labels, c, "image"))))
        if c.engine_offline:
            # RUN steps on the default network: as for containers (_offline_network),
            # behind the proxy the agent's own network namespace.
            asked_none = ("networkmode", "none") in q
            q = [(k, v) for k, v in q if k != "networkmode"] + [
                ("networkmode", "host" if c.egress_env and not asked_none else "none")]
            if c.egress_env and not asked_none:
                q = _with_build_proxy(q, c.egress_env)
        return Decision(_target(prefix, rest, q), mutating=True, what="image build")
    if rest == "/images/load" and method == "POST":
        q = queries.rebuild("images/load", q)
        return Decision(_target(prefix, rest, q), mutating=True, what="image load")
    m = re.match(r"^/images/" + _NAME + r"/(json|history)$", rest)
    if m is not None and method == "GET":
        q = queries.rebuild("images/inspect" if m.group(2) == "json" else "images/history", q)
        return Decision(_target(prefix, rest, q))
    m = re.match(r"^/distribution/" + _NAME + r"/json$", rest)
    if m is not None and method == "GET":
        return Decision(_target(prefix, rest, queries.rebuild("distribution", q)))
    m = re.match(r"^/images/" + _NAME + r"$", rest)
    if m is not None and method == "DELETE":
        q = queries.rebuild("images/delete", q)
        found = await c.image(m.group(1))
        labels_of = (found.get("Config") or {}).get("Labels") or found.get("Labels") or {}
        if labels_of.get(LABEL_AGENT) != c.agent_id:
            raise Refused("an agent removes only the images it built", 403)
        return Decision(_target(prefix, rest, q), mutating=True,
                        what=f"image remove {m.group(1)[:64]}")
    raise Refused(f"{method} {rest[:120]} is not allowed")


# Docker's predefined proxy build args (ALL_PROXY is not one: the builder
# warns that it was not consumed).
_BUILD_PROXY_ARGS = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "NO_PROXY"})


def _with_build_proxy(q: list[tuple[str, str]],
                      egress_env: tuple[str, ...]) -> list[tuple[str, str]]:
    """The agent's proxy settings as build args (the proxy names are
    Docker's predefined ones: a RUN step has them without an ARG, and they
    stay out of the image's history), unless the user gave that name."""
    args: dict[str, Any] = {}
    for k, v in q:
        if k == "buildargs" and v:
            try:
                args = json.loads(v)
            except ValueError:
                raise Refused("buildargs is not JSON", 400) from None
    if not isinstance(args, dict):
        raise Refused("buildargs is not an object", 400)
    for entry in egress_env:
        name, _, value = entry.partition("=")
        if name.upper() in _BUILD_PROXY_ARGS:
            args.setdefault(name, value)
    return [(k, v) for k, v in q if k != "buildargs"] + [("buildargs", json.dumps(args))]


def own(labels: Mapping[str, Any] | None, agent_id: str) -> bool:
    return bool(labels) and (labels or {}).get(LABEL_AGENT) == agent_id
