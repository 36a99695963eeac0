"""The broker's limits: what one agent's tool calls may cost the daemon.

Every number here bounds memory or descriptors the daemon (root, outside
the agent's limits) holds for an agent; the heavy work itself runs in the
agent's own scope (opener.py), where the agent's MemoryMax and TasksMax
apply. Defaults are chosen so that one agent at every limit at once costs
the daemon a few tens of MB at most; `[broker]` in the machine config
changes them (docs/configuration.md).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from leviathd.errors import LimitExceeded

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    read_max_bytes: int = MIB  # of one file, per read
    read_max_paths: int = 64  # paths in one read_files
    reply_max_bytes: int = MIB  # one reply line, encoded
    edit_max_bytes: int = 16 * MIB  # size of a file edit_file may rewrite
    request_max_bytes: int = MIB  # one request line
    json_max_depth: int = 32  # nesting of a request
    max_concurrent_calls: int = 4  # per agent, in flight at once
    max_connections: int = 8  # per agent, open at once
    max_pending_approvals: int = 8  # per agent, held for a person


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
