"""The registry of agents and their life cycle: start (checked, fenced, in a
scope), stop, list, logs, and the end of every agent however it ends. Knows
nothing of D-Bus or polkit: the bus layer hands it a `Caller`, an `Authority`
to ask for the rights a call needs and a `CallerWatch` that tells when a
caller has gone; systemd comes as a `SystemdManager` object.

`Agents` is one class made of one module per concern, each building on the
one before: the shared state and configuration (agents/base.py), the queries
and calls on one agent (agents/queries.py), the end and the recovery
(agents/ending.py), the planning of a start (agents/planning.py) and the
start itself (agents/start.py). The per-agent features it drives are
agents/feature.py's."""

from __future__ import annotations

from leviathd.agents.base import (
    AUTH_PATIENCE,
    MAX_LISTENERS,
    MAX_WAITING_PER_UID,
    NAMESPACE_STAND_IN,
    PLANNING_WORKERS,
    SLICE,
    Emit,
    unit_name,
)
from leviathd.agents.start import Starting

__all__ = [
    "AUTH_PATIENCE", "MAX_LISTENERS", "MAX_WAITING_PER_UID", "NAMESPACE_STAND_IN",
    "PLANNING_WORKERS", "SLICE", "Agents", "Emit", "unit_name",
]


class Agents(Starting):
    """The agents of this daemon: `run` (agents/start.py), `stop`, `get`,
    `watch`, `list`, `inspect`, `logs`, `audit` (agents/queries.py),
    `recover`, `reconcile`, `maintain` (agents/ending.py), `use` and the
    configuration (agents/base.py)."""
