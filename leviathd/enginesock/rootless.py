"""An agent's own container engine: rootless podman's API service, run as
the agent's user inside the agent's scope, with storage of its own.

Why: a filter in front of a root engine is one missed field away from host
root (issue 29). With the engine the user's own, whatever a request makes
the engine do, it does with the user's rights: a container's root is the
user (the rest of its ids are the user's subordinate ids), its conmon,
runtime, builds and healthchecks are processes of the agent's scope, under
its limits, and they end with it.

Where things are (all made by root, through descriptors):

- `/run/leviath/engine/<agent>.sock`: the service's API socket, bound and
  listened on by the daemon in its root-only folder and handed to podman as
  fd 3 by socket activation. Only the daemon (the agent's filtered proxy)
  connects to it; agents never see /run/leviath/engine.
- `/run/leviath/engine-user/<agent>/`: the service's XDG_RUNTIME_DIR (the
  user's, 0700, in a root folder 0711): runroot, libpod's tmpdir, podman's
  log.
- `<state>/engine-storage/<agent>/`: its storage (graph root, volumes,
  networks), the user's, 0700, in a root folder 0711. Per agent, not the
  user's ~/.local/share/containers: libpod's database records one runtime
  folder, so two services of one user on one storage would disagree, and
  what one agent imports or builds must not be what another (or the user)
  runs. Removed whole when the agent ends: nothing it made outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import stat
import sys
import syslog
from dataclasses import dataclass

from leviathd import fsat
from leviathd.broker.server import cgroup_of
from leviathd.enginesock import engine, engineroot
from leviathd.events import Event
from leviathd.identity import UserInfo
from leviathd.paths import runtime_dir
from leviathd.sandbox.container.cgroups import cgroup_procs_files
from leviathd.sandbox.forwarder import proxy_env
from leviathd.sandbox.spec import SYSTEM_DIRS, SYSTEM_LINK_DIRS
from leviathd.systemd import journal

MIN_SUBIDS = 65536
SUBID_FILES = ("/etc/subuid", "/etc/subgid")
MAX_SUBID_FILE = 4 << 20
USER_RUNTIME = "engine-user"
STORAGE = "engine-storage"
ENGINE_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


class RootlessUnavailable(OSError):
    """Rootless podman cannot run for this user here; the message says why."""


@dataclass(frozen=True)
class Places:
    socket: str  # the API socket (root's folder)
    runtime: str  # XDG_RUNTIME_DIR (the user's)
    storage: str  # graph root and volumes (the user's)


def socket_name(agent_id: str) -> str:
    return f"{agent_id}.sock"


def places(agent_id: str, state_dir: str) -> Places:
    return Places(os.path.join(engine.service_dir(), socket_name(agent_id)),
                  os.path.join(runtime_dir(), USER_RUNTIME, agent_id),
                  os.path.join(state_dir, STORAGE, agent_id))


def subid_count(text: str, user: UserInfo) -> int:
    """Subordinate ids /etc/subuid or /etc/subgid grants `user` (by name or
    uid), summed over its lines."""
    total = 0
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) != 3 or parts[0] not in (user.name, str(user.uid)):
            continue
        with contextlib.suppress(ValueError):
            if int(parts[1]) >= 0:  # a line with no valid start grants nothing
                total += max(0, int(parts[2]))
    return total


def preflight(user: UserInfo) -> str:
    """podman's path, or RootlessUnavailable with what the admin must do."""
    if user.uid == 0:
        raise RootlessUnavailable("root's agents get no engine socket: root's engine is root "
                                  "on the host")
    podman = shutil.which("podman", path=ENGINE_PATH)
    if podman is None:
        raise RootlessUnavailable("podman is not installed")
    for tool in ("newuidmap", "newgidmap"):
        if shutil.which(tool, path=ENGINE_PATH) is None:
            raise RootlessUnavailable(f"rootless podman needs {tool} (Debian package uidmap)")
    for path in SUBID_FILES:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(MAX_SUBID_FILE)
        except FileNotFoundError:
            text = ""
        if subid_count(text, user) < MIN_SUBIDS:
            raise RootlessUnavailable(
                f"user {user.name} has fewer than {MIN_SUBIDS} subordinate ids in {path}, which "
                f"rootless podman needs (as root: usermod --add-subuids N-M --add-subgids N-M "
                f"{user.name}; see docs/packaging.md)")
    return podman


def _user_folder(parent: str, name: str, user: UserInfo) -> None:
    """`parent` root's 0711 (made if missing), `name` in it the user's 0700.
    An entry that is not a folder is removed; a folder is taken over in
    place (its owner and mode set by descriptor)."""
    pfd = fsat.open_dir(parent, create_mode=0o711)
    try:
        fsat.set_owner_mode(pfd, 0, 0, 0o711)
        st = fsat.lstat_at(pfd, name)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            fsat.unlink_at(pfd, name)
        fd = fsat.subdir_at(pfd, name, 0o700)
        try:
            fsat.set_owner_mode(fd, user.uid, user.gid, 0o700)
        finally:
            os.close(fd)
    finally:
        os.close(pfd)


def prepare(agent_id: str, state_dir: str, user: UserInfo) -> Places:
    p = places(agent_id, state_dir)
    _user_folder(os.path.dirname(p.runtime), agent_id, user)
    _user_folder(os.path.dirname(p.storage), agent_id, user)
    return p


def bind(agent_id: str) -> socket.socket:
    """The API socket, bound and listening, root's 0600 in root's 0700 folder."""
    dfd = fsat.open_dir(engine.service_dir(), create_mode=0o700)
    try:
        fsat.set_owner_mode(dfd, 0, 0, 0o700)
        sock = fsat.bind_unix_at(dfd, socket_name(agent_id), mode=0o600, uid=0, gid=0)
    finally:
        os.close(dfd)
    sock.listen(128)
    return sock


def service_argv(podman: str) -> list[str]:
    """Every place named on the command line, as the engine's own root shows
    them (enginesock/engineroot.py): podman passes them on to the cleanup
    processes conmon runs (--exit-command-arg), and flags beat whatever a
    containers.conf/storage.conf says.

    cgroupfs: on a v1 (hybrid) host rootless podman makes no cgroups at all,
    so conmon, the runtime and the container's processes stay where the
    service is, the agent's scope, under its limits (measured in the bed:
    the container's sleep in memory, pids, cpu, devices and name=systemd of
    the scope)."""
    return [podman, *storage_flags(), "--cgroup-manager", "cgroupfs", "system", "service",
            "--time=0"]


def storage_flags() -> list[str]:
    """Where the engine's storage and runtime state are, as its root shows
    them; libpod's database records them, so whatever else opens that
    storage (enginesock/imagestore_exec.py) names them the same."""
    return ["--root", os.path.join(engineroot.STORAGE, "storage"),
            "--runroot", os.path.join(engineroot.RUN, "containers"),
            "--tmpdir", os.path.join(engineroot.RUN, "libpod", "tmp"),
            "--volumepath", os.path.join(engineroot.STORAGE, "volumes")]


def attach(supervisor_pid: int, unit: str, pid: int) -> str:
    """Moves `pid` into the agent's scope in every hierarchy (as the tool
    gate does for its shells): the scope is read from the agent's
    supervisor, which lives in it until the agent is released. Returns one
    of the scope's cgroup.procs files."""
    cgroup = cgroup_of(supervisor_pid)
    if unit not in cgroup.split("/"):
        raise OSError(f"the agent's supervisor is not in {unit}")
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        files = [x for x in cgroup_procs_files(cgroup, f.read()) if os.path.exists(x)]
    if not files:
        raise OSError(f"the control group {cgroup} is not mounted here")
    for path in files:
        with open(path, "w", encoding="ascii") as f:
            f.write(str(pid))
    return files[0]


async def start(agent_id: str, unit: str, supervisor_pid: int, user: UserInfo,
                state_dir: str, *, host_network: bool, agent_network: bool = False,
                image: bool = False, trust_bundle: str | None = None) -> str:
    """Starts the agent's service; its socket's path. The service itself
    runs once the agent's fence does (enginesock/rootless_exec.py: it sees
    what the fence shows), after the daemon has released the agent: until
    then a client's connection waits in the socket's backlog, and if the
    service never comes, the socket closes with the launcher's end.
    `host_network` false: the service gets a network namespace of its own
    with only lo, or with `agent_network` (network = "proxy") the agent's
    fence's own, whose only way out is the agent's proxy on its lo: the
    engine and every container it runs on the host network of that
    namespace reach exactly what the agent reaches, never more. `image`:
    the agent's fence is a container of an image (the container kind),
    which has no podman: the engine's system folders are the machine's,
    read-only, the rest the container's. `trust_bundle`: the CA bundle, as
    the fence names it, the engine trusts behind the agent's proxy."""
    podman = await asyncio.to_thread(preflight, user)
    mappers = [os.path.realpath(shutil.which(t, path=ENGINE_PATH) or t) for t in
               ("newuidmap", "newgidmap")]
    p = await asyncio.to_thread(prepare, agent_id, state_dir, user)
    sock = await asyncio.to_thread(bind, agent_id)
    fd = sock.fileno()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "leviathd.enginesock.rootless_exec",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, pass_fds=(fd,),
            env={"PATH": ENGINE_PATH},
        )
    finally:
        sock.close()
    assert proc.stdin is not None
    try:
        # Into the scope before it does anything: all it forks is the agent's.
        procs = await asyncio.to_thread(attach, supervisor_pid, unit, proc.pid)
        # HOME is the engine's own folder: a containers.conf the agent writes
        # into its home is never the engine's (nor its cleanup processes').
        env = {"PATH": ENGINE_PATH, "HOME": engineroot.RUN, "USER": user.name,
               "LOGNAME": user.name, "XDG_RUNTIME_DIR": engineroot.RUN, "TMPDIR": "/tmp",
               "LISTEN_FDNAMES": "api"}
        if agent_network and not host_network:
            # In the agent's network namespace the way out is the agent's
            # proxy: the engine's own pulls, and what podman hands on from its
            # environment (http_proxy = true: builds' RUN steps), go there,
            # under the agent's egress policy.
            env.update(proxy_env())
            # Its TLS trust: the system's CAs and the agent's proxy CA, for
            # the registries whose logins the proxy puts in (proxy/registries.py):
            # the agent's bundle, root's and read-only in the fence. Go reads
            # SSL_CERT_FILE, then the system's folder of CAs when it is not there.
            if trust_bundle is not None:
                env["SSL_CERT_FILE"] = trust_bundle
        orders = {"uid": user.uid, "gid": user.gid, "groups": list(user.groups), "fd": fd,
                  "argv": service_argv(podman), "env": env, "cwd": engineroot.RUN,
                  "log": os.path.join(engineroot.RUN, "podman.log"),
                  "private_network": not host_network and not agent_network,
                  "fence_network": agent_network and not host_network,
                  "supervisor": supervisor_pid,
                  "procs": procs, "run": p.runtime, "storage": p.storage, "mappers": mappers,
                  "system": list(SYSTEM_DIRS + SYSTEM_LINK_DIRS) if image else []}
        proc.stdin.write(json.dumps(orders).encode() + b"\n")
        await proc.stdin.drain()
        proc.stdin.close()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    # The launcher is the scope's now; the daemon does not wait for it (it
    # ends with the scope, also across a daemon restart), but journals what
    # it says (an engine that could not start).
    task = asyncio.get_running_loop().create_task(_said(agent_id, proc))
    _LISTENERS.add(task)
    task.add_done_callback(_LISTENERS.discard)
    return p.socket


_LISTENERS: set[asyncio.Task[None]] = set()
MAX_SAID = 4096


async def _said(agent_id: str, proc: asyncio.subprocess.Process) -> None:
    assert proc.stderr is not None
    with contextlib.suppress(OSError):
        said = await proc.stderr.read(MAX_SAID)
        if said.strip():
            journal.record(f"agent {agent_id}: its container engine: "
                           f"{said.decode(errors='replace').strip()}",
                           priority=syslog.LOG_WARNING, LEVIATH_AGENT=agent_id,
                           LEVIATH_EVENT=Event.ENGINE_SERVICE)


def remove(agent_id: str, state_dir: str) -> None:
    """What the agent's engine left: its socket, runtime folder and storage.
    Only after the scope has ended (nothing of the service runs), by
    descriptors; image layers hold files of the user's subordinate ids."""
    p = places(agent_id, state_dir)
    with contextlib.suppress(FileNotFoundError):
        fsat.unlink_path(p.socket)
    for folder in (p.runtime, p.storage):
        try:
            pfd = fsat.open_dir(os.path.dirname(folder))
        except FileNotFoundError:
            continue
        try:
            fsat.remove_tree_at(pfd, agent_id)
        finally:
            os.close(pfd)


def has_folders(agent_id: str, state_dir: str) -> bool:
    """Whether the agent has an engine socket or folder here (root's own
    folders: lstat only)."""
    p = places(agent_id, state_dir)
    return any(os.path.lexists(x) for x in (p.socket, p.runtime, p.storage))


def left_behind(state_dir: str) -> set[str]:
    """Agents with an engine folder or socket here."""
    found: set[str] = set()
    for folder in (os.path.join(runtime_dir(), USER_RUNTIME), os.path.join(state_dir, STORAGE)):
        with contextlib.suppress(OSError):
            found.update(os.listdir(folder))
    with contextlib.suppress(OSError):
        found.update(n.removesuffix(".sock") for n in os.listdir(engine.service_dir())
                     if n.endswith(".sock") and n != "podman.sock")
    return found
