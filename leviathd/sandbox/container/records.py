"""The daemon's record of each warm container (root-only, under the runtime
folder): its name, engine, PID 1 and that PID 1's identity, checked before use."""

from __future__ import annotations

import dataclasses
import json
import os

from leviathd import fsat
from leviathd.errors import Unavailable
from leviathd.paths import runtime_dir
from leviathd.sandbox import engine as engines
from leviathd.sandbox.container.settings import INIT_UID


def _record_path(name: str) -> str:
    return os.path.join(runtime_dir(), "containers", f"{name}.json")


@dataclasses.dataclass(frozen=True)
class Record:
    """What the worker needs to exec into a container (it has only the spec):
    written by `ensure` under the runtime folder, root only."""

    engine: engines.DetectedEngine
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
        eng = engines.DetectedEngine(**data.pop("engine"))
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


# The OCI runtimes whose exec takes a process.json (--process) from us.
_RUNTIMES_WITH_PROCESS_FILE = ("runc", "crun")
