"""An agent's record: who ran what, where, when, in which unit, and how it
ended. Kept in the state folder so that it outlives the agent and the daemon
(`lev ps --all`)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from leviathd import fsat
from leviathd.errors import NoSpace
from leviathd.paths import runtime_dir

# A full filesystem, or the state folder's owner over quota.
FULL = (errno.ENOSPC, errno.EDQUOT)


class AgentState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"
    # A scope of ours that systemd runs but whose record could not be read:
    # listed and stoppable, never forgotten while the scope lives.
    UNKNOWN = "unknown"


class AgentRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str
    uid: int
    user: str
    agent: str
    command: list[str]
    workdir: str
    unit: str
    sandbox: str
    marks: list[str] = []
    reads_granted: int = 0
    reads_declared: int = 0
    supervisor_pid: int = 0
    scratch: str = ""
    started_at: float
    ended_at: float | None = None
    exit_status: int | None = None
    state: AgentState = AgentState.RUNNING
    stop_requested: bool = False
    # The blueprint file the client read (its absolute path, as the client
    # said: `lev restart` reads it again, as the user); "" for a command.
    blueprint: str = ""
    # What the agent changed in the hook files it was given (issue 48:
    # sandbox/hookwatch.py), escaped, bounded; set at its end.
    hook_changes: list[str] = []

    @property
    def running(self) -> bool:
        return self.state is AgentState.RUNNING

    @property
    def active(self) -> bool:
        """Its scope may still run: running, or known only from systemd."""
        return self.state in (AgentState.RUNNING, AgentState.UNKNOWN)


_ID = re.compile(r"[0-9a-f]{8}")
_RECORD_NAME = re.compile(r"([0-9a-f]{8})\.json")
# A record is a few KB; anything much larger was not written by us.
MAX_RECORD_BYTES = 1 << 20
BAD_DIR = "bad"


@dataclass(frozen=True)
class Ended:
    """What the daemon keeps in memory of an ended agent: enough to page
    through `lev ps --all` and to apply retention; the rest stays on disk."""

    id: str
    uid: int
    ended_at: float


@dataclass
class Scan:
    records: list[AgentRecord] = field(default_factory=list)
    # (file name, where it went, why)
    bad: list[tuple[str, str, str]] = field(default_factory=list)


class RecordStore:
    """One JSON file per agent in `<state>/agents/`, written atomically; the
    supervisor's exit record sits beside it as `<id>.exit`. Ended agents are
    indexed (`ended`), not held: their records are read back when asked for."""

    def __init__(self, state_dir: str) -> None:
        self.dir = Path(state_dir) / "agents"
        self.ended: dict[str, Ended] = {}
        self._by_uid: dict[int, dict[str, float]] = {}

    def ensure(self) -> None:
        # Root's and 0700 (it says who ran what); the folders above keep their
        # mode, or 0755 when made here (users reach scratch under the state folder).
        parent, name = fsat.open_parent(str(self.dir), create_mode=0o755)
        try:
            fd = fsat.subdir_at(parent, name, 0o700)
        finally:
            os.close(parent)
        try:
            os.fchmod(fd, 0o700)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _fd(self) -> Iterator[int]:
        fd = fsat.open_dir(str(self.dir))
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            if exc.errno in FULL:
                raise NoSpace(str(self.dir.parent), exc.strerror or "") from None
            raise

    def exit_path(self, agent_id: str) -> str:
        return str(self.dir / f"{agent_id}.exit")

    def save(self, record: AgentRecord) -> None:
        """Raises NoSpace when the state filesystem is full; the caller
        decides whether the record waits in memory (see Agents.unsaved)."""
        # fsat.atomic_write_at: temp file, fsync, rename, fsync of the folder:
        # after a crash or a power cut the file is the old one or the new one.
        with self._writing(), self._fd() as fd:
            fsat.atomic_write_at(fd, f"{record.id}.json", record.model_dump_json().encode())
        if record.active:
            self._unindex(record.id)
        elif record.ended_at is not None:
            self.index_ended(record)

    def save_spec(self, agent_id: str, steps: list[tuple[str, dict[str, object]]]) -> None:
        """What the agent sees, step by step, for `lev inspect ID`."""
        data = json.dumps([{"label": lb, "spec": sp} for lb, sp in steps]).encode()
        with self._writing(), self._fd() as fd:
            fsat.atomic_write_at(fd, f"{agent_id}.spec.json", data)

    def load_spec(self, agent_id: str) -> list[dict[str, object]] | None:
        try:
            data = json.loads((self.dir / f"{agent_id}.spec.json").read_bytes())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, list) else None

    def load(self, agent_id: str) -> AgentRecord | None:
        """One record from disk (an ended agent's), or None if it is gone or bad."""
        if not _ID.fullmatch(agent_id):
            return None
        try:
            with self._fd() as fd:
                return _parse(fd, f"{agent_id}.json", agent_id)
        except (OSError, ValueError):
            return None

    def known(self, agent_id: str) -> bool:
        return agent_id in self.ended or (self.dir / f"{agent_id}.json").exists()

    def forget(self, agent_id: str) -> None:
        """Remove every file of an agent (one that never started, or one past
        retention)."""
        with self._fd() as fd:
            for suffix in (".json", ".spec.json", ".exit", ".step"):
                fsat.unlink_at(fd, f"{agent_id}{suffix}")
        self._unindex(agent_id)

    # --- the index of ended agents -------------------------------------------

    def index_ended(self, rec: AgentRecord) -> None:
        ended_at = rec.ended_at if rec.ended_at is not None else rec.started_at
        self.ended[rec.id] = Ended(rec.id, rec.uid, ended_at)
        self._by_uid.setdefault(rec.uid, {})[rec.id] = ended_at

    def _unindex(self, agent_id: str) -> None:
        entry = self.ended.pop(agent_id, None)
        if entry is not None:
            mine = self._by_uid.get(entry.uid, {})
            mine.pop(agent_id, None)
            if not mine:
                self._by_uid.pop(entry.uid, None)

    def expired(self, *, keep_days: int, max_per_user: int, now: float,
                uid: int | None = None) -> list[str]:
        """Ended agents past retention: too old, or beyond a user's count
        (oldest first). With `uid`, only that user's count is looked at."""
        horizon = now - keep_days * 86400
        out = [e.id for e in self.ended.values() if e.ended_at < horizon]
        gone = set(out)
        uids = [uid] if uid is not None else list(self._by_uid)
        for u in uids:
            mine = {i: t for i, t in self._by_uid.get(u, {}).items() if i not in gone}
            if len(mine) > max_per_user:
                oldest = sorted(mine, key=lambda i: (mine[i], i))
                out += oldest[: len(mine) - max_per_user]
        return out

    # --- start-up ------------------------------------------------------------

    def scan(self) -> Scan:
        """Every record on disk. A file that cannot be read as a record (not
        UTF-8, empty, not JSON, not a record, another agent's id) is moved
        aside into `bad/` and reported; it never stops the daemon."""
        result = Scan()
        try:
            dfd = fsat.open_dir(str(self.dir))
        except FileNotFoundError:
            return result
        try:
            for name in sorted(os.listdir(dfd)):
                m = _RECORD_NAME.fullmatch(name)
                if m is None:
                    continue
                try:
                    result.records.append(_parse(dfd, name, m.group(1)))
                except FileNotFoundError:
                    continue
                except (OSError, ValueError) as exc:
                    why = _why(exc)
                    result.bad.append((name, self._move_aside(dfd, name), why))
        finally:
            os.close(dfd)
        return result

    def _move_aside(self, dfd: int, name: str) -> str:
        dest = f"{name}.{int(time.time())}"
        try:
            fsat.mkdir_at(dfd, BAD_DIR, 0o700, exist_ok=True)
            bad = fsat.open_dir_at(dfd, BAD_DIR)
            try:
                fsat.rename_at(dfd, name, bad, dest)
            finally:
                os.close(bad)
        except OSError:
            return ""
        return str(self.dir / BAD_DIR / dest)

    def read_step(self, agent_id: str) -> tuple[int, str] | None:
        """The step the agent's supervisor last started (spawn._write_step):
        its index in the recorded spec and its label; None before the first."""
        try:
            with self._fd() as fd:
                data = json.loads(fsat.read_at(fd, f"{agent_id}.step", 4096))
            return int(data["index"]), str(data["label"])[:200]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def read_exit(self, agent_id: str) -> tuple[int, float] | None:
        """The supervisor's exit record: in the state folder, or, when that
        was full, in the runtime folder (see spawn._write_exit)."""
        for path in (self.exit_path(agent_id), spare_exit_path(agent_id)):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                # PID 1 of a handed-over agent (sandbox/supervisor._hand_over) writes
                # this one, with no time: the file's own says when.
                mtime = os.fstat(fd).st_mtime
                data = json.loads(os.read(fd, MAX_EXIT_BYTES))
                status = int(data["exit_status"])
                if not 0 <= status <= 255:
                    continue
                return status, float(data.get("ended_at", mtime))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            finally:
                os.close(fd)
        return None

    def drop_exit(self, agent_id: str) -> None:
        with self._fd() as fd:
            fsat.unlink_at(fd, f"{agent_id}.exit")
        spare = spare_exit_path(agent_id)
        with contextlib.suppress(OSError):
            fsat.unlink_path(spare)


MAX_EXIT_BYTES = 4096


def spare_exit_path(agent_id: str) -> str:
    """Where a supervisor leaves its agent's exit status when the state
    folder is full: the runtime folder is memory, so it outlives a daemon
    restart (RuntimeDirectoryPreserve) but not a reboot."""
    return os.path.join(runtime_dir(), "exit", f"{agent_id}.exit")


def _parse(dir_fd: int, name: str, agent_id: str) -> AgentRecord:
    data = fsat.read_at(dir_fd, name, MAX_RECORD_BYTES)
    if not data.strip():
        raise ValueError("empty")
    rec = AgentRecord.model_validate_json(data)
    if rec.id != agent_id:
        raise ValueError(f"holds the record of another id ({rec.id[:16]!r})")
    return rec


def _why(exc: Exception) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8"
    if isinstance(exc, ValidationError):
        return f"not a valid record ({exc.error_count()} errors)"
    return str(exc)[:200]
