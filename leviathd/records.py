"""An agent's record: who ran what, where, when, in which unit, and how it
ended. Kept in the state folder so that it outlives the agent and the daemon
(`lev ps --all`)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from leviathd import fsat


class AgentState(StrEnum):
    RUNNING = "running"
    EXITED = "exited"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"


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

    @property
    def running(self) -> bool:
        return self.state is AgentState.RUNNING


class RecordStore:
    """One JSON file per agent in `<state>/agents/`, written atomically; the
    supervisor's exit record sits beside it as `<id>.exit`."""

    def __init__(self, state_dir: str) -> None:
        self.dir = Path(state_dir) / "agents"

    def ensure(self) -> None:
        # Root's and 0700 (it says who ran what); the folders above keep their
        # mode, or 0755 when made here (users reach scratch under the state folder).
        parent, name = fsat.open_parent(str(self.dir), create_mode=0o755)
        try:
            fsat.mkdir_at(parent, name, 0o700, exist_ok=True)
            fd = fsat.open_dir_at(parent, name)
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

    def exit_path(self, agent_id: str) -> str:
        return str(self.dir / f"{agent_id}.exit")

    def save(self, record: AgentRecord) -> None:
        with self._fd() as fd:
            fsat.atomic_write_at(fd, f"{record.id}.json", record.model_dump_json().encode())

    def save_spec(self, agent_id: str, steps: list[tuple[str, dict[str, object]]]) -> None:
        """What the agent sees, step by step, for `lev inspect ID`."""
        data = json.dumps([{"label": lb, "spec": sp} for lb, sp in steps]).encode()
        with self._fd() as fd:
            fsat.atomic_write_at(fd, f"{agent_id}.spec.json", data)

    def load_spec(self, agent_id: str) -> list[dict[str, object]] | None:
        try:
            data = json.loads((self.dir / f"{agent_id}.spec.json").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, list) else None

    def forget(self, agent_id: str) -> None:
        """Remove every file of an agent that never started."""
        with self._fd() as fd:
            for suffix in (".json", ".spec.json", ".exit"):
                fsat.unlink_at(fd, f"{agent_id}{suffix}")

    def load_all(self) -> list[AgentRecord]:
        records = []
        for path in sorted(self.dir.glob("*.json")):
            if path.name.endswith(".spec.json"):
                continue
            try:
                records.append(AgentRecord.model_validate_json(path.read_text()))
            except (OSError, ValidationError):
                continue
        return records

    def read_exit(self, agent_id: str) -> tuple[int, float] | None:
        try:
            data = json.loads(Path(self.exit_path(agent_id)).read_text())
            return int(data["exit_status"]), float(data["ended_at"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def drop_exit(self, agent_id: str) -> None:
        with self._fd() as fd:
            fsat.unlink_at(fd, f"{agent_id}.exit")
