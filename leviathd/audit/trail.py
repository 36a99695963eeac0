"""The audit trail: how tool decisions are written to the journal, and how
they are read back so that nobody can forge them.

Writing (issue 20 §6). journald drops a unit's entries once it sends more
than its rate limit; one agent flooding refused calls used to cost every
other agent its records, end records included. So each agent has its own
budget of records (a token bucket); a decision over the budget is counted,
not written, and once a second the counts become one summary record
("1,234 refused calls to web_fetch in the last second"). A budget shared by
all agents caps the daemon's total below journald's limit (see
units/leviathd.service); lifecycle records (start, end, approvals) are not
budgeted and so are never crowded out.

Reading (issue 9 §3). Any local user can send journald an entry with
`LEVIATH_AGENT=...` and `SYSLOG_IDENTIFIER=leviathd`. Only fields journald
stamps itself (starting with `_`) tell who sent an entry, so an audit query
matches those: native protocol, uid 0, and the daemon's unit or the agent's
own scope (where its root supervisor records the steps)."""

from __future__ import annotations

import asyncio
import syslog
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from leviathd import metrics
from leviathd.budget import Bucket
from leviathd.events import Event
from leviathd.safetext import escape
from leviathd.systemd import journal

if TYPE_CHECKING:
    from leviathd.broker.core import AuditRecord

# Per agent: this many records at once, then this many a second.
AGENT_BURST = 100
AGENT_RATE = 20.0
# All agents together (the daemon's share of journald's limit).
TOTAL_BURST = 1000
TOTAL_RATE = 200.0
# Counts are summed per (tool, outcome); an agent naming ever new tools
# shares one bucket past this many.
SUMMARY_KEYS = 8
# An allowed call's target is what an admin looks for afterwards (which files
# did it write?), so a summary of allowed calls names the distinct targets,
# this many at most, each cut to this length.
SUMMARY_TARGETS = 32
TARGET_MAX = 256
# A record's own target, at most (longer ones are marked cut, with their length).
RECORD_TARGET_MAX = 4096
WINDOW = 1.0

# What `lev audit` gets of each entry (journalctl adds the timestamp and cursor).
FIELDS = (
    "MESSAGE", "LEVIATH_EVENT", "LEVIATH_AGENT", "LEVIATH_USER", "LEVIATH_TOOL",
    "LEVIATH_TARGET", "LEVIATH_OUTCOME", "LEVIATH_RULE", "LEVIATH_DETAIL", "LEVIATH_TAINT",
    "LEVIATH_TAINT_AFTER", "LEVIATH_CLEARANCE", "LEVIATH_COUNT", "LEVIATH_SUMMARY",
    "LEVIATH_ANSWER", "LEVIATH_BY_UID", "LEVIATH_EXIT_STATUS", "LEVIATH_STEP", "LEVIATH_TARGETS",
)
_WORDS = {"deny": "refused", "allow": "allowed", "error": "failed", "ask": "asked"}

Send = Callable[..., None]


def daemon_unit() -> str:
    """This daemon's own unit, as journald stamps it on our entries."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            for line in f:
                last = line.rstrip("\n").rsplit("/", 1)[-1]
                if last.endswith(".service"):
                    return last
    except OSError:
        pass
    return "leviathd.service"


def trusted_matches(agent_id: str, scope: str, unit: str | None = None) -> list[str]:
    """journalctl matches for an agent's records that only leviathd can
    produce: fields of the same name are ORed, different names ANDed."""
    return [
        "_TRANSPORT=journal", "_UID=0", f"LEVIATH_AGENT={agent_id}",
        f"_SYSTEMD_UNIT={unit or daemon_unit()}", f"_SYSTEMD_UNIT={scope}",
    ]


def query_argv(agent_id: str, scope: str, *, follow: bool) -> list[str]:
    argv = ["journalctl", "--no-pager", "--output=json", "--output-fields=" + ",".join(FIELDS),
            *trusted_matches(agent_id, scope)]
    if follow:
        # -f alone starts at the last ten entries.
        argv += ["--follow", "--lines=all"]
    return argv


# Refused and failed calls cost the agent nothing: they have a budget of their
# own, so a flood of them cannot push a call it was allowed to make (and its
# target) into a summary that names only the tool.
_REFUSED = ("deny", "error")


def _budget_class(outcome: str) -> str:
    return "refused" if outcome in _REFUSED else "done"


@dataclass
class _Agent:
    buckets: dict[str, Bucket]
    user: str
    held: Counter[tuple[str, str]] = field(default_factory=Counter)
    # Distinct targets of held allowed calls (a dict keeps their order), and
    # how many held allowed calls named a target past the bound.
    targets: dict[str, None] = field(default_factory=dict)
    targets_left_out: int = 0
    holding: set[str] = field(default_factory=set)
    since: float = 0.0
    timer: asyncio.TimerHandle | None = None


class AuditWriter:
    def __init__(
        self, *, send: Send = journal.record, agent_burst: int = AGENT_BURST,
        agent_rate: float = AGENT_RATE, total_burst: int = TOTAL_BURST,
        total_rate: float = TOTAL_RATE,
    ) -> None:
        self._send = send
        self._agent_burst = agent_burst
        self._agent_rate = agent_rate
        self._total = Bucket(total_burst, total_rate, total_burst)
        self._agents: dict[str, _Agent] = {}

    def tool(self, record: AuditRecord, *, taint_after: str = "-") -> None:
        """One decision: written, or counted for the next summary."""
        metrics.tool_decision(record.tool, record.outcome)
        state = self._agents.get(record.agent)
        if state is None:
            state = self._agents[record.agent] = _Agent({}, record.user)
        kind = _budget_class(record.outcome)
        bucket = state.buckets.get(kind)
        if bucket is None:
            bucket = state.buckets[kind] = Bucket(
                self._agent_burst, self._agent_rate, self._agent_burst)
        now = time.monotonic()
        # Once calls of a kind are being counted, later ones wait for the same
        # summary, so records never come out of order within a kind.
        if kind not in state.holding and bucket.take(now):
            if self._total.take(now):
                self._write(record, taint_after)
                return
            bucket.give_back()
        state.holding.add(kind)
        key = (record.tool[:64], record.outcome)
        if key not in state.held and len(state.held) >= SUMMARY_KEYS:
            key = ("(other tools)", record.outcome)
        if not state.held:
            state.since = time.time()
        state.held[key] += 1
        if kind == "done":
            self._keep_target(state, record.target)
        if state.timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop (a test): counts wait for flush() or finish()
            state.timer = loop.call_later(WINDOW, self.flush, record.agent)

    @staticmethod
    def _keep_target(state: _Agent, target: str) -> None:
        shown = escape(target, TARGET_MAX)
        if shown in state.targets:
            return
        if len(state.targets) < SUMMARY_TARGETS:
            state.targets[shown] = None
        else:
            state.targets_left_out += 1

    def flush(self, agent_id: str) -> None:
        """Write the agent's summary, if calls were held back."""
        state = self._agents.get(agent_id)
        if state is None:
            return
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        if not state.held:
            return
        held, state.held = state.held, Counter()
        targets, state.targets = list(state.targets), {}
        left_out, state.targets_left_out = state.targets_left_out, 0
        state.holding.clear()
        total = sum(held.values())
        seconds = max(time.time() - state.since, WINDOW)
        parts = [f"{n:,} {_WORDS.get(outcome, outcome)} call{'' if n == 1 else 's'} to {tool}"
                 for (tool, outcome), n in held.most_common()]
        named: dict[str, object] = {}
        if targets:
            named["LEVIATH_TARGETS"] = "\n".join(targets)
            more = f" and {left_out:,} more calls to targets not listed" if left_out else ""
            parts.append("targets " + ", ".join(targets) + more)
        self._send(
            f"agent {agent_id}: {', '.join(parts)} in the last {seconds:.0f} s "
            f"(over the audit limit of {self._agent_rate:g} records a second: counted, "
            "not recorded one by one)",
            priority=syslog.LOG_NOTICE, LEVIATH_EVENT=Event.TOOL_SUMMARY, LEVIATH_AGENT=agent_id,
            LEVIATH_USER=state.user, LEVIATH_COUNT=total,
            LEVIATH_SUMMARY="; ".join(f"{outcome} {tool} {n}"
                                      for (tool, outcome), n in held.most_common()),
            **named,
        )

    def finish(self, agent_id: str) -> None:
        """The agent ended: its last counts are written now, its budget freed."""
        self.flush(agent_id)
        self._agents.pop(agent_id, None)

    def _write(self, record: AuditRecord, taint_after: str) -> None:
        priority = syslog.LOG_INFO if record.outcome in ("allow", "ask") else syslog.LOG_NOTICE
        fields = record.journal_fields()
        target = record.target
        if len(target) > RECORD_TARGET_MAX:
            # The journal write is synchronous: an agent's 48,000-character
            # paths made each record ~100 KB and every other user's bus
            # call wait for journald (issue 31). The record says it is cut
            # and how long the target was; the decision saw all of it.
            target = (f"{target[:RECORD_TARGET_MAX]}… (cut: {len(target)} characters)")
            fields["LEVIATH_TARGET"] = target
            fields["LEVIATH_TARGET_LENGTH"] = str(len(record.target))
        self._send(
            f"agent {record.agent}: {record.tool} {target or '-'}: {record.outcome} "
            f"(rule {record.rule}, taint {record.taint}, clearance {record.clearance})"
            + (f": {record.detail}" if record.detail else ""),
            priority=priority, LEVIATH_EVENT=Event.TOOL,
            LEVIATH_AT=f"{record.at or time.time():.6f}", LEVIATH_TAINT_AFTER=taint_after,
            **fields,
        )


WRITER = AuditWriter()
