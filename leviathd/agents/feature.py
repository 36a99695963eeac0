"""The contract between `Agents` and the per-agent features (the tool gate,
the credentials, the network proxy, the filtered engine socket): what each
may add to an agent's sandbox and what it does at each point of the agent's
life. `Agents` is given the features once, as one ordered list, and calls
them in that order (a later feature may rely on what an earlier one made:
the proxy, the credentials and the engine socket use the gate's folder and
broker).

A new per-agent feature is one class implementing `AgentFeature` (subclass
`Feature` for the no-op defaults) and one entry in the list `daemon.py`
gives `Agents.use`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import ClassVar, Protocol

from leviathd.config.merge import Effective, MergeResult
from leviathd.identity import UserInfo
from leviathd.records import AgentRecord
from leviathd.sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)


class AgentFeature(Protocol):
    """One per-agent service. The calls, in the order an agent meets them:

    - `extend_spec(spec)`, then, once every feature has had that,
      `extend_effective(spec, eff)`: each step's sandbox spec passes through
      both before it is recorded and released (in a planning thread; pure
      but for bookkeeping keyed by the agent's id). The first pass shapes
      the sandbox (the gate binds the agent's folder, the proxy sets its
      variables); the second adds what the step's effective settings ask
      for, and may read what the first pass made.
    - `on_start(rec, merged, user)`: after the scope exists, before the
      agent is released. Raising aborts the start: then `on_end` runs for
      this feature and, in reverse order, every feature started before it,
      and nothing of the agent is left (`Agents` undoes the rest).
    - `on_fence(rec, pid)`: only where `holds_fence`; the pid of a namespace
      fence whose mounts are built and which waits before its command runs
      (sandbox/fencehold.py). Raising leaves it unanswered: the fence fails.
    - `on_handover(rec)`: the held process has handed the agent to its PID 1
      (rec.supervisor_pid now) and left. Synchronous; failures are logged.
    - `on_end(rec)`: once the agent has ended and its scope was asked to
      stop, or when its start failed at or after this feature's `on_start`.
      Must tolerate a start that failed half-way. Failures are logged and
      the other features' ends still run.
    - `recover()`: after a daemon (re)start, once `Agents.recover()` has
      adopted the running agents; in list order, or in the background after
      READY where `recovers_in_background`.
    - `close()`: daemon shutdown (the agents live on); bounded by
      `close_timeout`; one failing does not keep the others from closing.
    """

    holds_fence: ClassVar[bool]
    recovers_in_background: ClassVar[bool]
    close_timeout: ClassVar[float]

    def extend_spec(self, spec: SandboxSpec) -> SandboxSpec: ...

    def extend_effective(self, spec: SandboxSpec, eff: Effective) -> SandboxSpec: ...

    async def on_start(self, rec: AgentRecord, merged: MergeResult, user: UserInfo) -> None: ...

    async def on_fence(self, rec: AgentRecord, pid: int) -> None: ...

    def on_handover(self, rec: AgentRecord) -> None: ...

    async def on_end(self, rec: AgentRecord) -> None: ...

    async def recover(self) -> None: ...

    async def close(self) -> None: ...


class Feature:
    """`AgentFeature` with nothing done at any point: subclass it and
    override what the feature takes part in."""

    holds_fence: ClassVar[bool] = False
    recovers_in_background: ClassVar[bool] = False
    close_timeout: ClassVar[float] = 5.0

    def extend_spec(self, spec: SandboxSpec) -> SandboxSpec:
        return spec

    def extend_effective(self, spec: SandboxSpec, eff: Effective) -> SandboxSpec:
        return spec

    async def on_start(self, rec: AgentRecord, merged: MergeResult, user: UserInfo) -> None:
        return None

    async def on_fence(self, rec: AgentRecord, pid: int) -> None:
        return None

    def on_handover(self, rec: AgentRecord) -> None:
        return None

    async def on_end(self, rec: AgentRecord) -> None:
        return None

    async def recover(self) -> None:
        return None

    async def close(self) -> None:
        return None


def name(feature: AgentFeature) -> str:
    """For the logs."""
    return type(feature).__name__


def extend(features: Iterable[AgentFeature], spec: SandboxSpec, eff: Effective) -> SandboxSpec:
    """Both passes over one step's spec, each in list order."""
    ordered = list(features)
    for feature in ordered:
        spec = feature.extend_spec(spec)
    for feature in ordered:
        spec = feature.extend_effective(spec, eff)
    return spec


async def end(features: Sequence[AgentFeature], rec: AgentRecord) -> None:
    """Every feature's end, in the given order; one failing is logged and
    does not keep the next from running."""
    for feature in features:
        try:
            await feature.on_end(rec)
        except Exception:
            log.warning("agent %s: end of %s failed", rec.id, name(feature), exc_info=True)


async def recover(features: Sequence[AgentFeature]) -> list[asyncio.Task[None]]:
    """Each feature's recovery in list order; those that recover in the
    background are started as tasks (returned, for the shutdown to cancel)."""
    later: list[asyncio.Task[None]] = []
    for feature in features:
        if feature.recovers_in_background:
            later.append(asyncio.get_running_loop().create_task(feature.recover()))
        else:
            await feature.recover()
    return later


async def close(features: Sequence[AgentFeature]) -> list[str]:
    """Daemon shutdown: every feature's close is attempted, in list order,
    each bounded by its own timeout; a failure or a timeout is logged and
    the next one still closes. Returns the names of those that failed."""
    failed: list[str] = []
    for feature in features:
        try:
            await asyncio.wait_for(feature.close(), timeout=feature.close_timeout)
        except Exception:
            log.warning("closing %s failed", name(feature), exc_info=True)
            failed.append(name(feature))
    return failed
