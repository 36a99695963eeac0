"""The end of every agent however it ends, and the daemon's recovery after a
(re)start (agents/service.py): the handover from the held child to PID 1,
the watch on the supervisor, the agent's final record and clean-up, the
adoption of running agents, unknown scopes, retention and maintenance."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import syslog
import time
from collections import Counter

from leviathd import loopfd, reaping, safetext
from leviathd.agents import feature as feature_calls
from leviathd.agents import orphans, output
from leviathd.agents.base import SLICE, _logged, log
from leviathd.agents.queries import Queries
from leviathd.audit import trail as audit
from leviathd.domain.sandbox import SandboxKind
from leviathd.errors import NotFound
from leviathd.events import Event
from leviathd.identity import user_info
from leviathd.records import AgentRecord, AgentState
from leviathd.sandbox import claudestate, container, hookwatch, scratch, supervisor
from leviathd.systemd import journal

# Seconds between tries to watch a process the kernel would not give a
# pidfd for (EMFILE, ENOMEM).
WATCH_RETRY = 2.0

# Seconds an agent's end waits for the listing of its changes to hook files.
HOOK_LIST_PATIENCE = 10.0


class Ending(Queries):
    """An agent's end, recovery, retention."""

    # --- the end of an agent -----------------------------------------------

    def _await_handover(self, rec: AgentRecord, held: supervisor.Held) -> None:
        """The held process either stays as the supervisor (it closes its
        status pipe) or starts the agent's PID 1, says its pid and leaves
        (supervisor._hand_over): watch whichever stays. Until it has said, its
        end means nothing, so nothing is watched before."""
        loop = asyncio.get_running_loop()
        buf = bytearray()

        def readable() -> None:
            try:
                chunk = os.read(held.status_r, 64)
            except OSError:
                chunk = b""
            if chunk and len(buf) < 64:
                buf.extend(chunk)
                if not buf.endswith(b"\n"):
                    return
            loop.remove_reader(held.status_r)
            supervising = bytes(buf) == supervisor.SUPERVISING
            if not supervising:
                os.close(held.status_r)
            pid = supervisor.read_handover(bytes(buf))
            copy = self._copies.get(rec.id)
            if copy is not None:
                # The held child is reaped once the output is copied: its
                # zombie speaks for the agent after PID 1 (output.py).
                copy.start(pid if rec.running else None)
            if pid is not None and rec.running:
                if copy is None:
                    self._reap_later(rec.supervisor_pid)
                rec.supervisor_pid = pid
                self._save(rec)
                for feature in self.features:
                    with _logged(f"agent {rec.id}: handover of {feature_calls.name(feature)}"):
                        feature.on_handover(rec)
            self._watch(rec)
            if supervising:
                self._hear_end(rec.id, held.status_r)

        loopfd.add_fresh_reader(loop, held.status_r, readable)

    def _hear_end(self, agent_id: str, status_r: int) -> None:
        """A supervisor says ENDED once the exit record is written and the
        output copied, some ms before its own exit (the pidfd) is seen: the
        end is taken from the word. Whatever else comes (its exit without
        the word) ends the watch too."""
        loop = asyncio.get_running_loop()
        if agent_id not in self._watches:
            os.close(status_r)  # already ended, or never watched
            return

        def readable() -> None:
            with contextlib.suppress(OSError):
                os.read(status_r, 64)
            loop.remove_reader(status_r)
            os.close(status_r)
            if agent_id in self._watches:
                self._supervisor_ended(agent_id)

        loopfd.add_fresh_reader(loop, status_r, readable)

    def _reap_later(self, pid: int) -> None:
        """Our held child, which is leaving: reap it when it has."""
        reaping.reap_when_gone(pid)

    def _watch(self, rec: AgentRecord) -> None:
        """Learn of the supervisor's end through a pidfd, which works whether
        or not this daemon is its parent (after a restart it is not)."""
        try:
            pidfd = os.pidfd_open(rec.supervisor_pid)
        except ProcessLookupError:
            asyncio.get_running_loop().create_task(self._finalize(rec.id))
            return
        except OSError as exc:
            # Out of descriptors or memory for a while: an agent nobody
            # watches would stay "running" and its attached caller wait for
            # ever, so the watch is tried again until it holds.
            log.warning("agent %s: cannot watch pid %d yet (%s); trying again in %.0f s",
                        rec.id, rec.supervisor_pid, exc.strerror, WATCH_RETRY)
            asyncio.get_running_loop().call_later(WATCH_RETRY, self._watch_again, rec)
            return
        if not _supervisor_alive(rec):
            # A handed-over PID 1 that ended (and whose pid is reused):
            # the pidfd is pinned now, so this check holds.
            os.close(pidfd)
            asyncio.get_running_loop().create_task(self._finalize(rec.id))
            return
        self._watches[rec.id] = pidfd
        loopfd.add_fresh_reader(asyncio.get_running_loop(), pidfd,
                                self._supervisor_ended, rec.id)

    def _watch_again(self, rec: AgentRecord) -> None:
        if rec.running and rec.id not in self._watches and self.records.get(rec.id) is rec:
            self._watch(rec)

    def _supervisor_ended(self, agent_id: str) -> None:
        pidfd = self._watches.pop(agent_id, None)
        if pidfd is not None:
            asyncio.get_running_loop().remove_reader(pidfd)
            os.close(pidfd)
        asyncio.get_running_loop().create_task(self._finalize(agent_id))

    async def _finalize(self, agent_id: str) -> None:
        rec = self.records.get(agent_id)
        if rec is None or not rec.running or agent_id in self._finalizing:
            return
        self._finalizing.add(agent_id)
        try:
            copy = self._copies.pop(agent_id, None)
            if copy is not None:
                # Its last lines reach the journal and the caller before the
                # end is announced.
                with _logged(f"agent {agent_id}: copying its last output"):
                    await copy.finish()
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(rec.supervisor_pid, os.WNOHANG) == (0, 0):
                    # A supervisor that said ENDED and is still leaving.
                    self._reap_later(rec.supervisor_pid)
            ended = self._store.read_exit(agent_id)
            if ended is not None:
                rec.exit_status, rec.ended_at = ended
            else:
                rec.ended_at = time.time()
            if rec.stop_requested:
                rec.state = AgentState.STOPPED
            elif ended is None:
                rec.state = AgentState.FAILED
            else:
                rec.state = AgentState.EXITED
            if rec.scratch:
                # A scratch that cannot go now is the sweep's (maintain):
                # the end is recorded and announced whatever happens here, or
                # the agent would stay "running" and its caller wait for ever.
                with _logged(f"agent {agent_id}: removing its scratch"):
                    scratch.remove(rec.scratch)
            # Before the end is announced: whoever waits for it (`lev run`)
            # then finds the session state on the host. (Only a fenced step
            # made a copy; without one this is a few failed opens.)
            with _logged(f"agent {agent_id}: merging back its ~/.claude.json"):
                await asyncio.to_thread(_merge_claude_config, rec)
            before = self._hooks_before.pop(agent_id, None)
            if before is not None:
                # In the record before the end is announced: `lev run` asks
                # for it once told (issue 48).
                # Bounded: a user's folder that never answers (a stuck FUSE
                # mount) costs the listing, never the end.
                with _logged(f"agent {agent_id}: listing its changes to hook files"):
                    rec.hook_changes = await asyncio.wait_for(
                        asyncio.to_thread(_hook_changes, rec, before), HOOK_LIST_PATIENCE)
            saved = self._save(rec)
            # The record is final and the scratch gone: whoever waits for the
            # end (an attached `lev run`) may go on while the slower clean-up
            # below (containers, the broker, stragglers) finishes. Calls counted
            # over the audit budget are written first; the end record itself is
            # never budgeted.
            audit.WRITER.finish(agent_id)
            journal.record(
                f"agent {agent_id} ({rec.agent}) of {rec.user} ended: {rec.state.value}"
                + (f", exit status {rec.exit_status}" if rec.exit_status is not None else ""),
                LEVIATH_AGENT=agent_id, LEVIATH_USER=rec.user, LEVIATH_UNIT=rec.unit,
                LEVIATH_EVENT=Event.END, LEVIATH_EXIT_STATUS=rec.exit_status,
            )
            self._tell_ended(rec)
            image = self._images.pop(agent_id, None)
            self._scratch_sizes.pop(agent_id, None)
            if image is not None:
                # The last copy of the scratch's file, closed in a worker:
                # freeing its blocks (with the host's discards) is slow disk
                # work, which the agent's own end no longer waits for.
                await asyncio.to_thread(os.close, image)
            # Whatever the agent left behind in its scope ends with it.
            with _logged(f"agent {agent_id}: stopping {rec.unit} after its end"):
                await self._systemd.stop_unit(rec.unit)
            with _logged(f"agent {agent_id}: removing its containers after its end"):
                await container.end_hook(rec)
            await feature_calls.end(self.features, rec)
            if saved:
                # Unsaved, the exit record stays: it is what a restarted
                # daemon finds the exit status in.
                self._store.drop_exit(agent_id)
            asyncio.get_running_loop().call_later(1.0, self.readers.end_agent, agent_id)
            # Ended records live on disk (and in the store's small index).
            self.records.pop(agent_id, None)
            self.usage.forget(agent_id)
            self.apply_retention(uid=rec.uid)
        finally:
            self._finalizing.discard(agent_id)

    async def recover(self) -> None:
        """After a (re)start: adopt agents whose scope and supervisor still
        live, close the records of those that ended while we were away, list
        scopes of ours that have no usable record, and sweep scratch folders
        nobody owns. A record that cannot be read never stops this."""
        scan = self._store.scan()
        for name, moved_to, why in scan.bad:
            journal.record(
                f"agent record {self._store.dir / name} cannot be read ({why}); moved aside to "
                f"{moved_to or '(could not move it)'}; its agent, if its scope still runs, is "
                "listed as unknown",
                priority=syslog.LOG_WARNING, LEVIATH_EVENT=Event.RECORD_BAD,
            )
        for rec in scan.records:
            if not rec.active:
                self._store.index_ended(rec)
                continue
            self.records[rec.id] = rec
            if rec.state is AgentState.UNKNOWN:
                continue
            if not _supervisor_alive(rec):
                pid1 = _handed_over_pid1(rec)
                if pid1 is not None:
                    # We died between releasing it and hearing from it: its
                    # record still names the held process, long gone.
                    rec.supervisor_pid = pid1
                    self._save(rec)
            if _supervisor_alive(rec):
                self._adopt_output(rec)
                self._watch(rec)
                self.usage.seed(rec.id, rec.unit)
            else:
                await self._finalize(rec.id)
        try:
            await self.reconcile()
        except Exception as exc:  # systemd unreachable: keep what the records say
            journal.record(
                f"could not list leviath scopes from systemd: {exc}",
                priority=syslog.LOG_ERR, LEVIATH_EVENT=Event.RECONCILE_FAILED,
            )
            # Without the scope list, no scratch folder is known to be free.
            return
        self.apply_retention()
        self._sweep_scratch()
        with _logged("sweeping containers of ended agents"):
            await container.sweep({r.id for r in self.records.values() if r.active})

    def _adopt_output(self, rec: AgentRecord) -> None:
        """After a restart: an attached agent's output pipes, taken back from
        its PID 1, are copied to the journal again (its caller's copy ended
        with the old daemon; the caller learns the end by asking)."""
        if rec.sandbox not in (SandboxKind.NAMESPACE, SandboxKind.NONE) or rec.id in self._copies:
            return
        kept = output.take_kept(rec.supervisor_pid, fenced=rec.sandbox == SandboxKind.NAMESPACE)
        if kept is None:
            return
        try:
            gid = user_info(rec.uid).gid
        except (NotFound, OSError):
            gid = rec.uid
        # PID 1's parent is no longer us: systemd reaps it at once, and what
        # is still in the pipes then needs a pid of ours in its scope.
        witness = output.scope_witness(rec.supervisor_pid, rec.unit)
        copy = output.OutputCopy(rec.id, rec.unit, rec.uid, gid, kept, zombie=witness)
        copy.start(rec.supervisor_pid)
        self._copies[rec.id] = copy

    def _sweep_scratch(self) -> None:
        live = {r.id for r in self.records.values() if r.active}
        for folder in self._scratch_dirs():
            scratch.sweep(folder, live)

    async def reconcile(self) -> None:
        """Every live leviath scope is an agent we list: those without a
        record become `unknown` ones; unknown ones whose scope is gone end
        (state lost) and their scratch goes."""
        if self.podman_only:
            return
        scopes = await orphans.live_scopes(self._systemd, SLICE)
        live_ids: set[str] = set()
        for unit in scopes:
            parsed = orphans.parse_unit(unit)
            if parsed is None:
                continue
            user_part, agent_part, agent_id = parsed
            live_ids.add(agent_id)
            if agent_id in self.records:
                continue
            state = await self._systemd.unit_state(unit)
            uids = orphans.process_uids(state.control_group) if state is not None else None
            who = orphans.owner(user_part, uids or Counter())
            if who is None:
                # Whose it is cannot be told: only admins (manage-any) see it.
                who = (0, "root")
            rec = orphans.unknown_record(unit, who[0], who[1], agent_part, agent_id)
            self.records[agent_id] = rec
            self._save(rec)
            journal.record(
                f"scope {unit} runs without a usable record: listed as agent {agent_id} of "
                f"{who[1]} in state unknown",
                priority=syslog.LOG_WARNING, LEVIATH_AGENT=agent_id, LEVIATH_UNIT=unit,
                LEVIATH_EVENT=Event.RECORD_UNKNOWN,
            )
        # Its supervisor still writes the exit record when the agent ends
        # (supervisor._write_exit): that is how an unknown agent's end, and its
        # exit status, are known, even while stragglers keep the scope.
        exits = {r.id: self._store.read_exit(r.id) for r in self.records.values()
                 if r.state is AgentState.UNKNOWN}
        ended = [r for r in self.records.values() if r.state is AgentState.UNKNOWN
                 and (r.id not in live_ids or exits.get(r.id) is not None)]
        for rec in ended:
            got = exits.get(rec.id)
            if got is not None:
                rec.state = AgentState.STOPPED if rec.stop_requested else AgentState.EXITED
                rec.exit_status, rec.ended_at = got
            else:
                rec.state = AgentState.LOST
                rec.ended_at = time.time()
            saved = self._save(rec)
            self.records.pop(rec.id, None)
            journal.record(
                f"agent {rec.id} (record unknown) of {rec.user} ended: "
                + (f"exit status {rec.exit_status}" if got is not None else "its scope is gone"),
                LEVIATH_AGENT=rec.id, LEVIATH_UNIT=rec.unit, LEVIATH_EVENT=Event.END,
                LEVIATH_EXIT_STATUS=rec.exit_status,
            )
            self._tell_ended(rec)
            if rec.id in live_ids:
                # What the agent left behind in its scope ends with it.
                with _logged(f"agent {rec.id}: stopping {rec.unit} after its end"):
                    await self._systemd.stop_unit(rec.unit)
            if saved:
                self._store.drop_exit(rec.id)
        if ended:
            self._sweep_scratch()

    def apply_retention(self, *, uid: int | None = None) -> None:
        """Forget ended agents past the machine config's [records] policy."""
        policy = self.machine_config.records
        for agent_id in self._store.expired(
            keep_days=policy.keep_days, max_per_user=policy.max_per_user,
            now=time.time(), uid=uid,
        ):
            if agent_id not in self.records and agent_id not in self.unsaved:
                self._store.forget(agent_id)

    async def maintain(self, *, every: float = 5.0, retention_every: float = 3600.0) -> None:
        """Runs for the daemon's life: notices unknown agents' scopes ending
        and applies retention by age."""
        loop = asyncio.get_running_loop()
        next_retention = loop.time() + retention_every
        while True:
            await asyncio.sleep(every)
            try:
                self._unheard_ends()
                if self.unsaved:
                    self.write_unsaved()
                if any(r.state is AgentState.UNKNOWN for r in self.records.values()):
                    await self.reconcile()
                if loop.time() >= next_retention:
                    next_retention = loop.time() + retention_every
                    self.apply_retention()
            except Exception:
                log.exception("record maintenance failed; trying again later")

    def _unheard_ends(self) -> None:
        """Each watched supervisor's pidfd asked again, without the loop: an
        end the loop never delivered (a registration lost to a bug, such as
        CI4's stale descriptor number, loopfd.py) is then taken within two
        maintenance periods, not never, and said, so that it is looked into.
        Only a pidfd found ended at two checks in a row is taken: at one, the
        process may have just exited, its end still on its way through the
        loop (the loop would take it at its next turn)."""
        readable: set[str] = set()
        if self._watches:
            poller = select.poll()
            ids = {pidfd: agent_id for agent_id, pidfd in self._watches.items()}
            for pidfd in ids:
                poller.register(pidfd, select.POLLIN)
            readable = {ids[pidfd] for pidfd, _events in poller.poll(0)}
        lost, self._seen_ended = readable & self._seen_ended, readable
        for agent_id in lost:
            self._seen_ended.discard(agent_id)
            log.error("agent %s: its end was not heard from the event loop; ending it now",
                      agent_id)
            self._supervisor_ended(agent_id)

    def _scratch_dirs(self) -> list[str]:
        dirs = {self._scratch_default}
        configured = getattr(self.machine_config.sandbox, "scratch_dir", None)
        if configured:
            dirs.add(str(configured))
        return sorted(dirs)


def _merge_claude_config(rec: AgentRecord) -> None:
    """The session keys of the agent's copy of ~/.claude.json back into the
    host's (sandbox/claudestate.py); a worker thread's work."""
    try:
        user = user_info(rec.uid)
    except NotFound:
        return  # (an account deleted meanwhile: no home to merge into)

    def note(line: str) -> None:
        journal.record(line, priority=syslog.LOG_WARNING, LEVIATH_AGENT=rec.id,
                       LEVIATH_USER=rec.user)

    claudestate.merge_back(user.uid, user.gid, user.home, rec.id, rec.workdir, note)


def _hook_changes(rec: AgentRecord, before: hookwatch.Snapshot) -> list[str]:
    """What the agent changed in the hook files it was given, with one
    journal line naming them (a worker thread's work)."""
    try:
        user = user_info(rec.uid)
    except NotFound:
        return []
    changed, more = hookwatch.changes(before, hookwatch.snapshot(user.uid, user.gid, before.tops))
    if changed and more:
        changed.append("(and maybe more: not every entry was compared)")
    if not changed:
        return []
    journal.record(
        f"agent {rec.id} ({rec.agent}) of {rec.user} changed hook files it was given: "
        + ", ".join(safetext.escape(c, 200) for c in changed),
        priority=syslog.LOG_WARNING, LEVIATH_AGENT=rec.id, LEVIATH_USER=rec.user,
        LEVIATH_EVENT=Event.HOOK_FILES_CHANGED,
    )
    return [safetext.escape(c, 200) for c in changed]


def _handed_over_pid1(rec: AgentRecord) -> int | None:
    """The PID 1 of a namespace agent the held process handed over
    (sandbox/supervisor._hand_over), found in its scope: the process that is
    1 in its own PID namespace (NSpid). An agent cannot make namespaces
    (seccomp), so no other process of its scope is."""
    if rec.sandbox not in (SandboxKind.NAMESPACE, SandboxKind.NONE):
        return None
    from leviathd.systemd.cgroupfs import folders

    for folder in folders(f"/{SLICE}/{rec.unit}"):
        try:
            with open(os.path.join(folder, "cgroup.procs"), encoding="ascii") as f:
                pids = [int(p) for p in f.read(1 << 16).split()[:4096]]
        except (OSError, ValueError):
            continue
        if rec.sandbox == SandboxKind.NONE:
            return _none_recorder(pids, rec.uid)
        for pid in pids:
            try:
                with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
                    status = f.read(1 << 14)
            except OSError:
                continue
            nspid = next((ln.split()[1:] for ln in status.splitlines()
                          if ln.startswith("NSpid:")), [])
            if len(nspid) >= 2 and nspid[-1] == "1":
                return pid
        return None
    return None

def _none_recorder(pids: list[int], uid: int) -> int | None:
    """A kind-none agent's recorder (sandbox/none.start) among its scope's
    processes: our sealed dash, not dumpable (its /proc files are root's,
    which a memfd of the user's own, run under the same name, is not), and
    the first of them (its subshell is one too until it execs the command)."""
    if uid == 0:
        return None  # every process of root's looks the same
    found: dict[int, int] = {}
    for pid in pids:
        try:
            if not os.readlink(f"/proc/{pid}/exe").startswith("/memfd:leviath-init"):
                continue
            if os.stat(f"/proc/{pid}/fd").st_uid != 0:
                continue
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
                found[pid] = int(f.read(4096).rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    first = [pid for pid, ppid in found.items() if ppid not in found]
    return first[0] if len(first) == 1 else None

def _supervisor_alive(rec: AgentRecord) -> bool:
    """The recorded pid (the supervisor, or the PID 1 it handed the agent
    to) is still ours only if it sits in the agent's scope; a reused pid
    elsewhere does not count."""
    try:
        with open(f"/proc/{rec.supervisor_pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    # A whole component of the path (hierarchy-id:controllers:path), not a
    # substring of it.
    return any(rec.unit in line.split(":", 2)[-1].split("/") for line in lines)
