"""Where systemd is not PID 1: a stand-in for SystemdManager with the calls
the daemon makes (start_scope, stop_unit, unit_state).

There are no units. Each agent still gets a control group named like its
scope, `/leviath.slice/<unit>`, made by the daemon in every mounted cgroup
hierarchy (at the root of the cgroup namespace the daemon sees): the held
first process is moved there, podman puts the agent's container below it
(`--cgroup-parent`), and so the rest of the daemon works unchanged: a
supervisor's cgroup still names its unit (how a restarted daemon adopts it),
the tool broker's shell joins it, MEM and TASKS are read from it, and
stopping kills everything in it. The limits are the container's own
(`--memory`, `--pids-limit`): this module writes none.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from dbus_fast.aio import MessageBus

from leviathd.systemd.cgroupfs import folders
from leviathd.systemd.manager import ScopeLimits, SystemdError, SystemdManager, UnitState

BOOTED_MARKER = "/run/systemd/system"
SLICE_DIR = "leviath.slice"
# As the scopes' TimeoutStopUSec: SIGTERM, then SIGKILL after this long.
STOP_TIMEOUT = 10.0
NOTICE = (
    "systemd is not PID 1: agents run in podman containers only; no scopes, no "
    "systemctl/journalctl for agents, logs in {logs}"
)


def booted() -> bool:
    """sd_booted(): systemd made this folder at boot iff it is PID 1."""
    return os.path.isdir(BOOTED_MARKER)


def control_group(unit: str) -> str:
    """The agent's control group, as systemd's ControlGroup would name it."""
    return f"/{SLICE_DIR}/{unit}"


def _make(folder: str) -> None:
    """mkdir -p, giving each new v1 cpuset folder its parent's cpus and mems
    (an empty cpuset takes no process)."""
    parent = os.path.dirname(folder)
    if not os.path.isdir(parent):
        _make(parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o755)
    for name in ("cpuset.cpus", "cpuset.mems"):
        mine = os.path.join(folder, name)
        if os.path.exists(mine) and not _read(mine).strip():
            with open(mine, "w", encoding="ascii") as f:
                f.write(_read(os.path.join(parent, name)))


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except OSError:
        return ""


def _subtree(folder: str) -> list[str]:
    """The folder and every cgroup below it, deepest first."""
    found = [d for d, _subdirs, _files in os.walk(folder)]
    return sorted(found, key=lambda d: d.count("/"), reverse=True)


def _pids(cgroup: str) -> set[int]:
    pids: set[int] = set()
    for top in folders(cgroup):
        for d in _subtree(top):
            pids.update(int(p) for p in _read(os.path.join(d, "cgroup.procs")).split())
    return pids


class NoSystemd(SystemdManager):
    """The daemon's systemd backend where there is no systemd (see module
    doc). A subclass only so that it goes where a SystemdManager is expected:
    every method the daemon calls is overridden, none reaches the bus."""

    def __init__(self, bus: MessageBus) -> None:
        super().__init__(bus)
        self._reapers: dict[str, asyncio.Task[None]] = {}

    async def attach(self) -> None:
        return None

    async def start_scope(
        self, name: str, *, pids: list[int], slice_name: str, description: str,
        limits: ScopeLimits,
    ) -> None:
        del slice_name, description, limits  # limits: the container's own
        tops = folders(control_group(name))
        if not tops:
            raise SystemdError("no cgroup hierarchy is mounted: agents cannot be placed")
        try:
            for top in tops:
                _make(top)
                for pid in pids:
                    with open(os.path.join(top, "cgroup.procs"), "w", encoding="ascii") as f:
                        f.write(str(pid))
        except OSError as exc:
            raise SystemdError(f"cannot place {name} in {control_group(name)}: {exc}") from None

    async def stop_unit(self, name: str) -> None:
        """SIGTERM to everything in the agent's cgroup (its supervisor, which
        waits for its command, the command in the container, conmon and the
        container's init), SIGKILL to what is left after STOP_TIMEOUT, then
        the folders go. Returns at once, as StopUnit does."""
        if name in self._reapers or not any(os.path.isdir(t) for t in folders(control_group(name))):
            return
        _signal_all(_pids(control_group(name)), signal.SIGTERM)
        task = asyncio.get_running_loop().create_task(self._reap(name))
        self._reapers[name] = task

    async def _reap(self, name: str) -> None:
        cgroup = control_group(name)
        try:
            deadline = time.monotonic() + STOP_TIMEOUT
            while _pids(cgroup) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            for _ in range(50):
                left = _pids(cgroup)
                if not left:
                    break
                _signal_all(left, signal.SIGKILL)
                await asyncio.sleep(0.1)
            for _ in range(50):
                busy = False
                for top in folders(cgroup):
                    for d in _subtree(top) if os.path.isdir(top) else []:
                        try:
                            os.rmdir(d)
                        except FileNotFoundError:
                            pass
                        except OSError:
                            busy = True
                if not busy:
                    break
                await asyncio.sleep(0.1)
        finally:
            self._reapers.pop(name, None)

    async def unit_names(self, states: list[str], patterns: list[str], limit: int) -> list[str]:
        # Never asked (no reconcile without systemd: podman alone fences).
        del states, patterns, limit
        return []

    async def unit_state(self, name: str) -> UnitState | None:
        cgroup = control_group(name)
        tops = [t for t in folders(cgroup) if os.path.isdir(t)]
        if not tops:
            return None
        pids = _pids(cgroup)
        memory: int | None = None
        tasks: int | None = None
        for top in tops:
            for file in ("memory.usage_in_bytes", "memory.current"):
                text = _read(os.path.join(top, file)).strip()
                if text.isdigit() and memory is None:
                    memory = int(text)
            text = _read(os.path.join(top, "pids.current")).strip()
            if text.isdigit() and tasks is None:
                tasks = int(text)
        return UnitState(
            name=name,
            active_state="deactivating" if name in self._reapers else (
                "active" if pids else "inactive"),
            memory_current=memory,
            tasks_current=tasks if tasks is not None else len(pids),
            control_group=cgroup,
        )



def _signal_all(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
