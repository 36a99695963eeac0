"""Running the engine (daemon side, asyncio, root): the agent's warm container
started or found for its settings, its network forwarder, its pinned workdir."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import sys
import syslog
from typing import Any

from leviathd.domain.workdir import refuse_system_workdir
from leviathd.errors import InvalidArgument, Unavailable
from leviathd.events import Event
from leviathd.paths import runtime_dir
from leviathd.sandbox import engine as engines
from leviathd.sandbox import guard, oci_seccomp, pinned
from leviathd.sandbox.container import pins
from leviathd.sandbox.container.availability import _engine
from leviathd.sandbox.container.cgroups import (
    _JOIN,
    _join_files,
    _subtree_control,
    _unit_cgroup,
    limits_the_parent_can_take,
)
from leviathd.sandbox.container.records import (
    _RUNTIMES_WITH_PROCESS_FILE,
    Record,
    _read_record,
    _write_record,
    check_init,
    init_state,
)
from leviathd.sandbox.container.settings import (
    INIT_UID,
    LABEL_DAEMON,
    _write_identity,
    config_key,
    container_name,
    container_options,
    daemon_instance,
    idle_command,
    init_binary,
    labels,
    seccomp_dir,
)
from leviathd.sandbox.spec import SandboxSpec, is_within
from leviathd.systemd import journal
from leviathd.systemd.manager import SystemdManager

_locks: dict[str, asyncio.Lock] = {}


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


async def _record_for(
    eng: engines.DetectedEngine, name: str, found: dict[str, Any] | None
) -> Record:
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


def _runtime_state(eng: engines.DetectedEngine, run_output: str) -> dict[str, Any] | None:
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


async def _inspect(eng: engines.DetectedEngine, name: str) -> dict[str, Any] | None:
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
    if not effective.image:
        raise Unavailable("the container sandbox needs an image ([sandbox] image)")
    # The ID the name had at config load, never what the tag says now (pins.py).
    image = await pins.pinned(str(effective.engine), str(effective.image))
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
    """network = "proxy": the relay to the daemon's proxy (sandbox/forwarder.py)
    in the container's network namespace (the engine's `none`: only lo),
    born in the agent's scope so the proxy knows whose it is and systemd
    ends it with the agent. The namespace travels as a descriptor opened
    here from the init checked at start, not as a pid the forwarder opens."""
    from leviathd.sandbox import forwarder

    sock = os.path.join(runtime_dir(), "agents", spec.execution_id, forwarder.SOCKET_NAME)
    netns = os.open(f"/proc/{init_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        argv = ["sh", "-c", _JOIN, "join", *_join_files(cgroup), "--",
                sys.executable, "-m", "leviathd.sandbox.forwarder", str(netns), sock,
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



def _tail(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " / ".join(lines[-3:]) if lines else "no output"
