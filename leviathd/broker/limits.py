"""How the broker holds to its limits: the descriptor budget over all agents
and the `too-large` refusal. The per-agent numbers themselves (`Limits`) are
a ground-floor value in domain/brokerlimits.py, which the config and the
policy settings carry without importing the broker.
"""

from __future__ import annotations

import resource

from leviathd.errors import LimitExceeded


def descriptor_budget() -> int:
    """How many broker connections the daemon holds at most, over all agents:
    half its soft file limit, so clients never take the descriptors the
    daemon needs for everything else."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(8, soft // 2)


def too_large(limit: str, value: int, what: str) -> LimitExceeded:
    return LimitExceeded(limit, value, f"{what} (limit {limit} = {value})")
