"""The questions about agents and the calls on one (agents/service.py):
Stop, Get, Watch, List's pages, Inspect, Logs and Audit, each authorized on
the record's owner before anything of the record is told."""

from __future__ import annotations

import os

from leviathd import listing, safetext
from leviathd.agents.base import MAX_LISTENERS, AgentsBase
from leviathd.audit import trail as audit
from leviathd.authority import Caller, Right
from leviathd.errors import NotFound, Unavailable
from leviathd.events import Event
from leviathd.records import AgentRecord
from leviathd.systemd import journal


class Queries(AgentsBase):
    """List, Get, Watch, Stop, Inspect, Logs, Audit."""

    # --- queries and control -----------------------------------------------

    def lookup(self, agent_id: str) -> AgentRecord | None:
        """A running agent from memory, an ended one from disk."""
        rec = self.records.get(agent_id) or self.unsaved.get(agent_id)
        if rec is None and agent_id in self._store.ended:
            rec = self._store.load(agent_id)
        return rec

    def _owner(self, agent_id: str) -> int | None:
        """Whose agent this is, from memory (an ended one's from the index)."""
        rec = self.records.get(agent_id) or self.unsaved.get(agent_id)
        if rec is not None:
            return rec.uid
        entry = self._store.ended.get(agent_id)
        return None if entry is None else entry.uid

    async def _authorize_record(self, who: Caller, agent_id: str, what: str) -> AgentRecord:
        # Each path asks polkit once, and an ended agent's record is read from
        # disk only after: answered before polkit, an absent id took 0.3 ms
        # and another user's 2.5 ms (an ended one's 0.25 ms more for the
        # read), which told a caller whose ids have a record (test_redteam_bus2.py).
        owner = self._owner(agent_id)
        if owner is None:
            await self._authority.allowed(who, Right.MANAGE_ANY)
            raise NotFound(f"no agent with id {agent_id!r}")
        if owner == who.uid:
            await self._authority.require(who, Right.RUN, what)
        elif not await self._authority.allowed(who, Right.MANAGE_ANY):
            # Another user's agent does not exist, as far as this caller can tell.
            raise NotFound(f"no agent with id {agent_id!r}")
        rec = self.lookup(agent_id)
        if rec is None or rec.uid != owner:
            raise NotFound(f"no agent with id {agent_id!r}")
        return rec

    async def stop(self, who: Caller, agent_id: str) -> None:
        rec = await self._authorize_record(who, agent_id, "stop agents")
        if not rec.active:
            return
        # Once per agent: every Stop until it has ended (10 s for one that
        # ignores SIGTERM) wrote a record and an fsynced save, 380 a second
        # from one user, outside any budget (test_redteam_bus2.py). A later
        # Stop still asks systemd, in case the first one failed there.
        if not rec.stop_requested:
            rec.stop_requested = True
            if rec.running:
                self._save(rec)
            journal.record(
                f"agent {agent_id} stop requested by uid {who.uid}",
                LEVIATH_AGENT=agent_id, LEVIATH_EVENT=Event.STOP, LEVIATH_BY_UID=who.uid,
            )
        await self._systemd.stop_unit(rec.unit)

    async def _live(self, rec: AgentRecord) -> dict[str, int | None]:
        if not rec.active:
            return {}
        state = await self._systemd.unit_state(rec.unit)
        if state is None:
            return {}
        return {
            "memory": state.memory_current, "tasks": state.tasks_current,
            "memory_max": state.memory_max, "tasks_max": state.tasks_max,
        }  # fmt: skip

    async def get(self, who: Caller, agent_id: str) -> tuple[AgentRecord, dict[str, int | None]]:
        rec = await self._authorize_record(who, agent_id, "inspect agents")
        return rec, await self._live(rec)

    async def watch(self, who: Caller, agent_id: str) -> AgentRecord:
        """As get, and the caller's connection hears the agent's end. The
        record is read after the check with no await in between, so an end
        is either in the record returned or still to be signalled."""
        rec = await self._authorize_record(who, agent_id, "inspect agents")
        if rec.active:
            listeners = self._signal_to.setdefault(agent_id, [])
            if who.sender not in listeners:
                listeners.append(who.sender)
                # The first stays (the starter, or after a restart the first
                # to ask, as lev run does at once): dropping the oldest let
                # eight more watchers take the end from an attached lev run.
                del listeners[1:-(MAX_LISTENERS - 1)]
        return rec

    def _tell_ended(self, rec: AgentRecord) -> None:
        status = -1 if rec.exit_status is None else rec.exit_status
        for to in self._signal_to.pop(rec.id, []):
            self._on_ended(rec.id, status, rec.state.value, to=to,
                           hook_changes=list(rec.hook_changes))

    async def list(
        self, who: Caller, *, include_ended: bool, cursor: str = "",
        limit: int = listing.DEFAULT_ROWS, budget: int = listing.REPLY_BUDGET,
    ) -> tuple[list[tuple[AgentRecord, dict[str, int | None]]], str]:
        """One page: agents that run (oldest first), then, with include_ended,
        ended ones (most recent first), at most `limit` rows and about `budget`
        bytes. Returns the rows and the cursor of the next page ("" at the end)."""
        everyone = await self._authority.allowed(who, Right.MANAGE_ANY)
        after = listing.parse_cursor(cursor)
        mine = [r for r in self.records.values() if everyone or r.uid == who.uid]
        keys: list[tuple[listing.Key, str]] = [
            (listing.running_key(r.started_at, r.id), r.id) for r in mine if r.active
        ]
        if include_ended:
            keys += [
                (listing.ended_key(e.ended_at, e.id), e.id) for e in self._store.ended.values()
                if everyone or e.uid == who.uid
            ]
            # An agent whose end is being written (its scratch removed, its
            # ~/.claude.json merged back) is no longer running and not yet in
            # the ended index: it is listed as ended, from memory, or it would
            # be missing from `lev ps --all` for that moment.
            keys += [
                (listing.ended_key(r.ended_at or r.started_at, r.id), r.id) for r in mine
                if not r.active and r.id not in self._store.ended
            ]
        keys = sorted(k for k in keys if after is None or k[0] > after)
        page = listing.Page(limit=limit, budget=budget)
        for key, agent_id in keys:
            # Memory first: an ended agent still in it holds its final state.
            rec = (self.records.get(agent_id) or self.unsaved.get(agent_id)
                   or self._store.load(agent_id))
            if rec is None:
                continue
            if not page.add(key, rec):
                break
        # From memory: no call per agent (issue 18); the figures of running
        # agents are refreshed in the background when a List finds them old.
        await self.usage.fill((r.id, r.unit) for r in page.records if r.active)
        rows = [(rec, self.usage.get(rec.id) if rec.active else {}) for rec in page.records]
        self.usage.touch((r.id, r.unit) for r in self.records.values() if r.active)
        return rows, page.next_cursor

    async def inspect(self, who: Caller, agent_id: str) -> str:
        """The sandbox spec of each of the agent's steps, as JSON."""
        await self._authorize_record(who, agent_id, "inspect agents")
        steps = self._store.load_spec(agent_id)
        if steps is None:
            raise NotFound(f"agent {agent_id} has no recorded sandbox spec")
        # Bounded like List and Get: the spec carries the client's command
        # line and environment, up to megabytes of them.
        return listing.capped_json(steps)

    async def logs(self, who: Caller, agent_id: str, follow: bool) -> int:
        rec = await self._authorize_record(who, agent_id, "read agents' logs")
        follow = follow and rec.running
        # The agent's output streams only: not what else ran in its scope
        # (a container engine) and wrote to the journal.
        argv = ["journalctl", "--no-pager", "-o", "cat", "--all", f"_SYSTEMD_UNIT={rec.unit}",
                f"SYSLOG_IDENTIFIER={safetext.AGENT_IDENTIFIER}"]
        if follow:
            # -f alone starts at the last ten lines; the output is wanted whole.
            argv += ["--follow", "--lines=all"]
        if not journal.available():
            # No journald (systemd is not PID 1): the supervisor wrote the
            # agent's output to its log file in the state folder.
            path = journal.log_path(rec.id)
            if not os.path.exists(path):
                read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
                os.close(write_fd)
                return read_fd
            argv = ["tail", "-c", "+1", *(["-f"] if follow else []), "--", path]
        return await self.readers.start(who, argv, agent_id=rec.id, follow=follow)

    async def audit(self, who: Caller, agent_id: str, follow: bool) -> int:
        """The agent's audit records as journalctl's JSON lines, matched on
        fields only journald sets (see leviathd/audit/trail.py)."""
        rec = await self._authorize_record(who, agent_id, "read agents' audit records")
        if not journal.available():
            raise Unavailable("there is no journal here (systemd is not PID 1): the audit "
                              "records went to leviathd's standard error")
        follow = follow and rec.running
        argv = audit.query_argv(rec.id, rec.unit, follow=follow)
        return await self.readers.start(who, argv, agent_id=rec.id, follow=follow)
