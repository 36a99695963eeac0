"""An agent's record: who ran what, where, when, in which unit, and how it
ended. Kept in the state folder so that it outlives the agent and the daemon
(`lev ps --all`)."""

from __future__ import annotations

import contextlib
import json
import os
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError


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
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.dir, 0o700)

    def exit_path(self, agent_id: str) -> str:
        return str(self.dir / f"{agent_id}.exit")

    def save(self, record: AgentRecord) -> None:
        path = self.dir / f"{record.id}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(record.model_dump_json())
        os.replace(tmp, path)

    def save_spec(self, agent_id: str, steps: list[tuple[str, dict[str, object]]]) -> None:
        """What the agent sees, step by step, for `lev inspect ID`."""
        path = self.dir / f"{agent_id}.spec.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"label": lb, "spec": sp} for lb, sp in steps]))
        os.replace(tmp, path)

    def load_spec(self, agent_id: str) -> list[dict[str, object]] | None:
        try:
            data = json.loads((self.dir / f"{agent_id}.spec.json").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, list) else None

    def forget(self, agent_id: str) -> None:
        """Remove every file of an agent that never started."""
        for suffix in (".json", ".spec.json", ".exit"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.dir / f"{agent_id}{suffix}")

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
        try:
            os.unlink(self.exit_path(agent_id))
        except FileNotFoundError:
            pass
