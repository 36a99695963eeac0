"""Scopes of ours that systemd runs but no usable record describes (its file
was empty, not UTF-8 or invalid, and was moved aside). Such an agent must
not be forgotten: it is listed as `unknown`, its owner and admins can stop it,
and its scratch is kept until the scope is gone. What is known of it comes
from systemd (the unit name) and the kernel (its processes' uids)."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import time
from collections import Counter
from typing import Protocol

from leviathd.records import AgentRecord, AgentState
from leviathd.sandbox.container import cgroup_procs_files

# leviath-<user>-<agent>-<id>.scope; user and agent have every character but
# [A-Za-z0-9_.] replaced by "_" (agents.unit_name), so "-" separates exactly.
_UNIT = re.compile(r"leviath-([A-Za-z0-9_.]+)-([A-Za-z0-9_.]+)-([0-9a-f]{8})\.scope")
_LIVE_STATES = ("active", "activating", "deactivating", "reloading")
MAX_SCOPES = 100_000
# What the lost record said it ran is gone; clients have always had a command.
UNKNOWN_COMMAND = "(unknown: the record was lost)"


def parse_unit(name: str) -> tuple[str, str, str] | None:
    """(user, agent, id) as written into the unit name, or None if not ours."""
    m = _UNIT.fullmatch(name)
    return (m.group(1), m.group(2), m.group(3)) if m else None


class UnitLister(Protocol):
    """What the orphan scan needs of systemd (SystemdManager has it)."""

    async def unit_names(
        self, states: list[str], patterns: list[str], limit: int
    ) -> list[str]: ...


async def live_scopes(systemd: UnitLister, slice_name: str) -> list[str]:
    """Names of every live leviath-*.scope in our slice."""
    names = await systemd.unit_names(list(_LIVE_STATES), ["leviath-*.scope"], MAX_SCOPES)
    # ListUnitsByPatterns has no slice filter; the unit's own prefix is ours and
    # the daemon only ever creates such scopes in `slice_name`.
    del slice_name
    return [n for n in names if parse_unit(n) is not None]


def process_uids(cgroup: str) -> Counter[int]:
    """Real uids of the processes in a scope's cgroup."""
    uids: Counter[int] = Counter()
    try:
        with open("/proc/self/mountinfo") as f:
            mountinfo = f.read()
    except OSError:
        return uids
    for procs in cgroup_procs_files(cgroup, mountinfo):
        try:
            with open(procs) as f:
                pids = [int(p) for p in f.read().split()[:256]]
        except (OSError, ValueError):
            continue
        for pid in pids:
            with contextlib.suppress(OSError, ValueError, IndexError):
                uids[os.stat(f"/proc/{pid}").st_uid] += 1
        if uids:
            break
    return uids


def owner(user_in_name: str, uids: Counter[int]) -> tuple[int, str] | None:
    """Whose agent: the named user if processes of theirs run in the scope or
    none run as anyone else; else the one non-root uid among its processes."""
    named: int | None = None
    with contextlib.suppress(KeyError):
        named = pwd.getpwnam(user_in_name).pw_uid
    others = [u for u in uids if u != 0]
    if named is not None and (named in uids or not others):
        return named, user_in_name
    if len(others) == 1:
        uid = others[0]
        try:
            return uid, pwd.getpwuid(uid).pw_name
        except KeyError:
            return uid, str(uid)
    if named is not None:
        return named, user_in_name
    return None


def unknown_record(unit: str, uid: int, user: str, agent: str, agent_id: str) -> AgentRecord:
    return AgentRecord(
        id=agent_id, uid=uid, user=user, agent=agent, command=[UNKNOWN_COMMAND], workdir="",
        unit=unit,
        sandbox="unknown", marks=["record-lost"], started_at=time.time(),
        state=AgentState.UNKNOWN,
    )
