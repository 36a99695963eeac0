"""The broker's limits: what one agent's tool calls may cost the daemon.

Every number here bounds memory or descriptors the daemon (root, outside
the agent's limits) holds for an agent; the heavy work itself runs in the
agent's own scope (broker/opener.py), where the agent's MemoryMax and
TasksMax apply. Defaults are chosen so that one agent at every limit at once
costs the daemon a few tens of MB at most; `[broker]` in the machine config
changes them (docs/configuration.md).

A plain value on the ground floor: the config builds it, the policy settings
carry it per agent, the broker enforces it (broker/limits.py holds the
broker's own helpers), and none of them need import another for it.
"""

from __future__ import annotations

from dataclasses import dataclass

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
