"""The start of an agent (agents/service.py): checked, fenced, in a scope,
polkit's answer awaited beside the preparation; one transaction in named
steps (`_START_STEPS`), each registering the undo of what it takes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import errno
import os
import secrets
import socket
import syslog
import time
from collections.abc import Awaitable, Callable

from leviathd import fdclose, loopfd, metrics, resource_defaults, safetext
from leviathd.agents import admission, output
from leviathd.agents import feature as feature_calls
from leviathd.agents.base import AUTH_PATIENCE, MAX_WAITING_PER_UID, SLICE, _logged, unit_name
from leviathd.agents.feature import AgentFeature
from leviathd.agents.planning import Planning, _Prepared
from leviathd.agents.request import RunInput
from leviathd.authority import Caller, Right
from leviathd.config.merge import Effective
from leviathd.domain.sandbox import SandboxKind
from leviathd.domain.sensitivity import Sensitivity
from leviathd.domain.workdir import refuse_system_workdir
from leviathd.errors import AccessDenied, Busy, ConfigError, InvalidArgument, NoSpace, Unavailable
from leviathd.events import Event
from leviathd.policy import filelabels
from leviathd.records import FULL, AgentRecord
from leviathd.sandbox import fencehold, hookwatch, launchers, loopfs, scratch, supervisor
from leviathd.sandbox.spec import DEFAULT_SCRATCH_DIR, DEFAULT_SCRATCH_SIZE, SandboxSpec, expand
from leviathd.systemd import journal
from leviathd.systemd.manager import ScopeLimits, SystemdError

# What a start can run out of for a while, by errno: said by name, as a
# passing shortage, not as a fault of the daemon.
_EXHAUSTED = {
    errno.EMFILE: "open files for leviathd", errno.ENFILE: "open files",
    errno.EAGAIN: "processes", errno.ENOMEM: "memory",
}


@dataclasses.dataclass
class _Start:
    """One start under way: what its steps have taken, for the next steps
    and for the running agent once the start holds."""

    who: Caller
    req: RunInput
    stdio: supervisor.Stdio
    auth: asyncio.Future[int]
    # Set once polkit has answered; the planning thread waits on it.
    granted: concurrent.futures.Future[None]
    p: _Prepared
    agent_id: str
    unit: str
    held_stdio: supervisor.Stdio
    hold: tuple[socket.socket, socket.socket] | None = None
    clients: tuple[int | None, int | None] | None = None
    # The output pipes' descriptors until the copy owns them.
    loose: list[int] = dataclasses.field(default_factory=list)
    copy: output.OutputCopy | None = None
    image: int | None = None
    held: supervisor.Held | None = None
    scope: asyncio.Future[None] | None = None
    scope_stopped: bool = False
    scope_usec: int = 0
    real_workdir: str = ""
    holding: bool = False
    steps: list[tuple[str, SandboxSpec]] = dataclasses.field(default_factory=list)
    polkit_usec: int = 0
    scratch_path: str = ""
    rec: AgentRecord | None = None
    hooks_before: hookwatch.Snapshot | None = None

    def required_held(self) -> supervisor.Held:
        assert self.held is not None, "the held child is forked before this step"
        return self.held

    def required_scope(self) -> asyncio.Future[None]:
        assert self.scope is not None, "the scope is asked for before this step"
        return self.scope

    def required_rec(self) -> AgentRecord:
        assert self.rec is not None, "the record is made before this step"
        return self.rec

    def drop_output(self) -> None:
        """The undo of the output pipes: the copy, or the loose descriptors."""
        if self.copy is not None:
            self.copy.close()
        for fd in self.loose:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.loose = []


class Starting(Planning):
    """Run: the start of an agent."""

    # --- start -------------------------------------------------------------

    async def run(self, who: Caller, req: RunInput, stdio: supervisor.Stdio) -> AgentRecord:
        try:
            rec = await self._counted_run(who, req, stdio)
        except BaseException as exc:
            _count_failure(exc)
            raise
        metrics.STARTS.inc()
        return rec

    async def _counted_run(self, who: Caller, req: RunInput,
                           stdio: supervisor.Stdio) -> AgentRecord:
        try:
            if self.config_problem:
                raise ConfigError(self.config_problem)
            return await self._run(who, req, stdio)
        except TimeoutError as exc:
            # A wait of the start that ran out (the held child's workdir
            # check, the planning thread's wait for polkit): a machine too
            # busy to start the agent now. The steps taken are undone; the
            # caller reads that, not "internal error" (seen once in a soak
            # under load 15-20).
            raise Unavailable(
                "the machine is too busy to start the agent now (a step of its start ran out "
                "of time); nothing of it was started, try again") from exc
        except OSError as exc:
            # The scratch folder or a record that did not fit: the caller is
            # told where space is missing, not "internal error".
            if exc.errno in FULL:
                raise NoSpace(str(self._store.dir.parent), exc.strerror or "") from None
            if exc.errno in _EXHAUSTED:
                raise Unavailable(
                    f"the machine is short of {_EXHAUSTED[exc.errno]} ({exc.strerror}); "
                    "nothing of the agent was started, try again") from exc
            raise
        finally:
            # The supervisor has its own copies; ours must not leak. The
            # caller's files: closed off the loop (fdclose.py).
            fdclose.discard_all(stdio.fds())

    async def _authorize(self, who: Caller, req: RunInput) -> int:
        """The rights this request needs; the polkit time in microseconds."""
        t0 = time.perf_counter()
        await self._authority.require(who, Right.RUN, "run agents")
        usec = int((time.perf_counter() - t0) * 1e6)
        if req.sandbox == SandboxKind.NONE:
            await self._authority.require(
                who, Right.RUN_UNSANDBOXED, "run an agent without a sandbox"
            )
        return usec

    async def _run(self, who: Caller, req: RunInput, stdio: supervisor.Stdio) -> AgentRecord:
        # polkit's answer (a few ms) is awaited beside the request's
        # preparation, the held fork and the scope's job, not before them
        # (issue 18): the held child runs nothing of the caller's until it is
        # released, which happens only once polkit said yes; a refusal
        # aborts the child and stops the scope, leaving nothing (docs/
        # security-model.md). What would cost more than that before the
        # answer (an engine probe, a warning in the journal) waits for it.
        if (who.uid in self._granted
                and self._plan_waiting.get(who.uid, 0) >= MAX_WAITING_PER_UID):
            # Refused either way (_in_worker), so polkit is not asked: `lev
            # run` asks again while Busy, and at 1,000 starts sent at once
            # (250 a user, hundreds of clients each asking about once a
            # second) every ask cost a polkit check (bench/scale.py: 426 of
            # 1,000 gave up after lev's patience). Only for a uid polkit said
            # yes to: anyone else hears polkit's answer first, as before.
            raise Busy(f"uid {who.uid} has {MAX_WAITING_PER_UID} requests being prepared; "
                       "try again later")
        auth = asyncio.ensure_future(self._authorize(who, req))
        auth.add_done_callback(lambda done: self._heard(who.uid, done))
        # Starts under way per uid: each is charged a keyring and a place
        # under the cap before it holds them (agents/admission.py).
        self._starting[who.uid] = self._starting.get(who.uid, 0) + 1
        try:
            return await self._start(who, req, stdio, auth)
        except asyncio.CancelledError:
            auth.cancel()
            raise
        except BaseException as exc:
            # A refusal outranks what else went wrong (after the clean-up):
            # a caller polkit refuses learns nothing more of the request.
            await _refusal_first(auth, exc)
            raise
        finally:
            left = self._starting[who.uid] - 1
            if left:
                self._starting[who.uid] = left
            else:
                del self._starting[who.uid]

    async def _start(
        self, who: Caller, req: RunInput, stdio: supervisor.Stdio, auth: asyncio.Future[int]
    ) -> AgentRecord:
        t0 = time.perf_counter()
        granted: concurrent.futures.Future[None] = concurrent.futures.Future()
        auth.add_done_callback(lambda done: _settle(granted, done))
        p = await self._in_worker(who.uid, self._prepare, who.uid, req,
                                  lambda: granted.result(timeout=AUTH_PATIENCE))  # fmt: skip
        # Counted on the loop, which alone changes the records: the other
        # starts under way are already running or counted in _starting.
        admission.check_cap(p.user.name, self._running_of(who.uid),
                            self._starting.get(who.uid, 1), self._agent_cap())
        if auth.done():
            auth.result()  # refused already: no fork, no scope
        elif (who.uid not in self._granted
                or self._unanswered.get(who.uid, 0) >= MAX_WAITING_PER_UID):
            # A caller polkit has not answered yet holds at most this many
            # forks and scopes; further starts wait for their answer first.
            # One it never said yes to (or refused last) waits for it at
            # once: a refused user's starts then cause no fork, no scope,
            # not even systemd's lines about one in the journal.
            await auth
        self._unanswered[who.uid] = self._unanswered.get(who.uid, 0) + 1
        auth.add_done_callback(lambda _done: self._answered(who.uid))
        # Here, not when the request is parsed: from here on the caller's
        # descriptors are closed however the request ends.
        refuse_system_workdir(req.workdir, p.user.home)
        agent_id = self._new_id()
        s = _Start(who=who, req=req, stdio=stdio, auth=auth, granted=granted, p=p,
                   agent_id=agent_id, unit=unit_name(p.user.name, p.agent_name, agent_id),
                   held_stdio=stdio)
        # The start as one transaction: each step registers the undo of what
        # it takes where it takes it; a step that raises unwinds them, the
        # last first, and the start leaves nothing (docs/architecture.md).
        async with contextlib.AsyncExitStack() as undo:
            for _name, step in _START_STEPS:
                await step(self, s, undo)
            undo.pop_all()  # the agent runs: what it holds is its own now
        return self._started(s, t0)

    # The steps of a start, in order; each takes what it needs and registers
    # its undo on the stack it is given.

    async def _take_fence_hold(self, s: _Start, undo: contextlib.AsyncExitStack) -> None:
        # Each namespace fence may have to wait for the daemon's marks
        # (sandbox/fencehold.py): decided once the workdir is known.
        if launchers.held_needs(s.p.kinds).fence_hold and any(
                f.holds_fence for f in self.features):
            s.hold = fencehold.pair()
            undo.callback(s.hold[0].close)
            # The child's end is closed once it is forked (a second close
            # does nothing): this is for a start that fails before.
            undo.callback(s.hold[1].close)

    async def _take_output_pipes(self, s: _Start, undo: contextlib.AsyncExitStack) -> None:
        # An attached one-command namespace agent whose caller gave pipes:
        # the daemon copies its output, no supervisor stays (agents/output.py).
        s.clients = (_copied_clients(s.p.kinds, s.stdio)
                     if len(self._copies) < output.budget() else None)
        if s.clients is None:
            return
        # The undo first and each descriptor in it as soon as it exists: a
        # pipe2 that fails (EMFILE under a low file limit) leaks none.
        s.loose = [fd for fd in s.clients if fd is not None]
        undo.callback(_quietly, f"agent {s.agent_id}: closing its output", s.drop_output)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        s.loose += [out_r, out_w]
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        s.loose += [err_r, err_w]
        s.held_stdio = supervisor.Stdio(stdin=s.stdio.stdin, stdout=out_w, stderr=err_w,
                                        kept=(out_r, err_r))

    async def _take_scratch_image(self, s: _Start, undo: contextlib.AsyncExitStack) -> None:
        if launchers.held_needs(s.p.kinds).scratch_image:
            eff = s.p.merged.agent
            size = eff.scratch_size or DEFAULT_SCRATCH_SIZE
            s.image = self._scratch_image(eff, size)
            if s.image is not None:
                undo.callback(os.close, s.image)
                # Made (or a ready one checked, issue 47) here, off the loop,
                # so that a scratch that cannot be made, or would take more
                # of scratch_dir's disk than one user may, refuses the start
                # with the reason (issue 48).
                uid = s.p.user.uid
                mine = sum(n for u, n in self._scratch_sizes.values() if u == uid)
                self._scratch_sizes[s.agent_id] = (uid, size)
                undo.callback(self._scratch_sizes.pop, s.agent_id, None)
                await self._in_worker(s.who.uid, loopfs.prepare, s.image, size,
                                      mine, eff.scratch_user_max)

    async def _fork_held(self, s: _Start, undo: contextlib.AsyncExitStack) -> None:
        user = s.p.user
        needs = launchers.held_needs(s.p.kinds)
        try:
            s.held = supervisor.fork_held(
                user, s.req.workdir, exit_path=self._store.exit_path(s.agent_id),
                identifier=safetext.AGENT_IDENTIFIER, unit=s.unit, stdio=s.held_stdio,
                shell=_shared_shell() if needs.shell else None,
                init=_shared_shell(init=True) if needs.init else None,
                hold=s.hold[1].fileno() if s.hold else None, image=s.image,
            )
        finally:
            if s.hold:
                s.hold[1].close()
        undo.callback(_reap_aborted, s.held)
        if s.clients is not None:
            # The child has the write ends; the copy owns the rest from here.
            assert s.held_stdio.kept is not None
            for fd in (s.held_stdio.stdout, s.held_stdio.stderr):
                if fd is not None:
                    os.close(fd)
            s.loose = []
            s.copy = output.OutputCopy(s.agent_id, s.unit, user.uid, user.gid,
                                       s.held_stdio.kept, s.clients, zombie=s.held.pid)

    async def _start_scope(self, s: _Start, undo: contextlib.AsyncExitStack) -> None:
        held, user, eff = s.required_held(), s.p.user, s.p.merged.agent

        async def start_scope() -> None:
            t_scope = time.perf_counter()
            await self._systemd.start_scope(
                s.unit, pids=[held.pid], slice_name=SLICE,
                description=safetext.description(
                    f"leviath agent {s.p.agent_name} of {safetext.escape(user.name, 64)} "
                    f"({s.agent_id})"
                ),
                limits=_limits(eff),
            )
            s.scope_usec = int((time.perf_counter() - t_scope) * 1e6)

        # The scope's job (systemd's share of a start, the longest single
        # wait) runs while the workdir is checked and the specs are built:
        # neither depends on it, and the held child runs nothing until it is
        # released below, inside the scope (issue 18).
        s.scope = asyncio.ensure_future(start_scope())
        undo.push_async_callback(self._stop_scope, s)

    async def _check_and_plan(self, s: _Start, undo: contextlib.AsyncExitStack) -> None:
        held, user = s.required_held(), s.p.user
        try:
            ok, detail = await _read_status(held)
            if not ok:
                raise InvalidArgument(detail)
            s.real_workdir = detail
            # Again as resolved: a link in the user's home may lead to /etc.
            refuse_system_workdir(s.real_workdir, user.home)
            # The mark is read through the user's workdir, which may be a
            # FUSE mount of the user's that never answers: in the caller's
            # planning lane, never on the loop every user shares.
            s.holding = s.hold is not None and await self._in_worker(
                s.who.uid, _labelled_workdir, held)
            # Specs look at the user's workdir (a worktree's git folders...).
            s.steps = await self._in_worker(
                s.who.uid, self._specs, s.p.plan, s.p.kinds, user, s.req, s.real_workdir,
                s.agent_id, s.p.other_homes, lambda: s.granted.result(timeout=AUTH_PATIENCE))
            # The hook files given to it, before it can write them: listed
            # at its end if it changed them (issue 48).
            tops = hookwatch.watched_tops(s.real_workdir, _hook_files_given(s.p.plan, user.home))
            if tops:
                s.hooks_before = await self._in_worker(
                    s.who.uid, _hook_snapshot, s.agent_id, user.uid, user.gid, tops)
            s.polkit_usec = await s.auth
        except InvalidArgument as exc:
            # A scope that failed kills what it held: then the held process
            # "ended before it was ready" because of this.
            if str(exc) == supervisor.ENDED_EARLY:
                scope_exc = await _outcome(s.required_scope())
                if scope_exc is not None:
                    raise scope_exc from exc
            raise

    async def _make_scratch(self, s: _Start, undo: contextlib.AsyncExitStack) -> None:
        for _label, spec in s.steps:
            if spec.kind == SandboxKind.NAMESPACE and not s.scratch_path:
                s.scratch_path = scratch.create(spec)
                undo.callback(_quietly, f"agent {s.agent_id}: removing its scratch",
                              scratch.remove, s.scratch_path)

    async def _record(self, s: _Start, undo: contextlib.AsyncExitStack) -> None:
        p, req, eff = s.p, s.req, s.p.merged.agent
        s.rec = AgentRecord(
            id=s.agent_id, uid=p.user.uid, user=p.user.name, agent=p.agent_name,
            command=p.command or p.plan[-1][2], workdir=s.real_workdir, unit=s.unit,
            sandbox="+".join(dict.fromkeys(p.kinds)), marks=p.marks,
            reads_granted=len(eff.read_paths_granted),
            reads_declared=len(eff.read_paths_declared),
            supervisor_pid=s.required_held().pid, scratch=s.scratch_path,
            started_at=time.time(),
            blueprint=(req.blueprint_source if req.blueprint_text is not None
                       and req.blueprint_source.startswith("/") else ""),
        )
        undo.callback(_quietly, f"agent {s.agent_id}: forgetting its record",
                      self._store.forget, s.agent_id)
        # Without containers the steps are final here: the spec and the
        # record (each written and fsynced, a few ms) are written while
        # systemd's job still runs (issue 18), not after it.
        if not _ensures(p.kinds):
            self._save_start(s.rec, [(label, spec.to_dict()) for label, spec in s.steps])

    async def _scope_ready(self, s: _Start, undo: contextlib.AsyncExitStack) -> None:
        await s.required_scope()

    async def _start_features(self, s: _Start, undo: contextlib.AsyncExitStack) -> None:
        started: list[AgentFeature] = []

        async def end_started() -> None:
            # As at an agent's end: its scope is asked to stop first.
            await self._stop_scope(s)
            await feature_calls.end(started[::-1], s.required_rec())

        undo.push_async_callback(end_started)
        for feature in self.features:
            # Its end undoes a start that fails from here on, its own
            # included (agents/feature.py).
            started.append(feature)
            await feature.on_start(s.required_rec(), s.p.merged, s.p.user)

    async def _start_containers(self, s: _Start, undo: contextlib.AsyncExitStack) -> None:
        # A kind's own resources (containers) are set up once the scope
        # exists (their cgroups sit below it) and after the features (whose
        # folders they bind, such as the broker's). Steps with identical
        # settings share one.
        if not _ensures(s.p.kinds):
            return
        for kind in dict.fromkeys(s.p.kinds):
            undo.push_async_callback(_teardown, s.agent_id, kind)
        containers: set[str] = set()
        for n, ((_label, step_eff, _argv), (label, spec)) in enumerate(
            zip(s.p.plan, s.steps, strict=True)
        ):
            ensure = launchers.launcher(spec.kind).ensure
            if ensure is not None:
                s.steps[n] = (label, await ensure(
                    s.agent_id, s.unit, spec, step_eff, units=self._systemd, started=containers,
                    pinned_workdir=s.required_held().workdir_path(),
                ))
        self._save_start(s.required_rec(), [(label, spec.to_dict()) for label, spec in s.steps])

    async def _release(self, s: _Start, undo: contextlib.AsyncExitStack) -> None:
        spec_dicts = [(label, spec.to_dict()) for label, spec in s.steps]
        try:
            supervisor.release(s.required_held(), spec_dicts, hold=s.holding)
        except BrokenPipeError as exc:
            # Gone since it said its workdir was fine: nothing of it runs,
            # so nothing of it may stay (its record, scratch, scope).
            raise Unavailable(supervisor.ENDED_EARLY) from exc

    async def _stop_scope(self, s: _Start) -> None:
        """The undo of the scope, once however many steps ask: its start is
        over (either way) before it is stopped, since a stop sent first
        would leave it behind."""
        if s.scope is None or s.scope_stopped:
            return
        s.scope_stopped = True
        await _outcome(s.scope)
        with contextlib.suppress(SystemdError, OSError):
            await self._systemd.stop_unit(s.unit)

    def _started(self, s: _Start, t0: float) -> AgentRecord:
        """The start has held: what it took becomes the running agent's."""
        rec, held, user, agent_id, unit = (s.required_rec(), s.required_held(), s.p.user,
                                           s.agent_id, s.unit)
        self.records[agent_id] = rec
        if s.image is not None:
            self._images[agent_id] = s.image
        if s.hold and s.holding:
            task = asyncio.ensure_future(
                fencehold.serve(s.hold[0], lambda pid: self._fence_ready(rec, pid)))
            self._holds.add(task)
            task.add_done_callback(self._holds.discard)
        elif s.hold:
            s.hold[0].close()
        spawn_usec = int((time.perf_counter() - t0) * 1e6)
        if s.copy is not None:
            self._copies[agent_id] = s.copy
        if s.hooks_before is not None:
            self._hooks_before[agent_id] = s.hooks_before
        self._await_handover(rec, held)
        self.usage.seed(rec.id, rec.unit, cgroup=f"/{SLICE}/{unit}")
        journal.record(
            f"agent {agent_id} ({s.p.agent_name}) started for {user.name} in {unit}",
            LEVIATH_AGENT=agent_id, LEVIATH_USER=user.name, LEVIATH_UNIT=unit,
            LEVIATH_SANDBOX=rec.sandbox, LEVIATH_EVENT=Event.START,
            LEVIATH_SPAWN_USEC=spawn_usec, LEVIATH_POLKIT_USEC=s.polkit_usec,
            LEVIATH_SCOPE_USEC=s.scope_usec,
        )
        if rec.reads_declared and not rec.reads_granted:
            journal.record(
                f"agent {agent_id} ({s.p.agent_name}) declares {rec.reads_declared} read paths "
                "and the configuration grants none: reads outside the workdir will be refused",
                priority=syslog.LOG_WARNING, LEVIATH_AGENT=agent_id,
                LEVIATH_EVENT=Event.READS_NOT_GRANTED,
            )
        self._signal_to[agent_id] = [s.who.sender]
        self._on_started(agent_id, unit, user.uid, to=s.who.sender)
        return rec

    def _save_start(
        self, rec: AgentRecord, spec_dicts: list[tuple[str, dict[str, object]]]
    ) -> None:
        self._store.save_spec(rec.id, spec_dicts)
        # Before the release: an agent whose record cannot be written does
        # not start (a full disk), and nothing of it is left behind.
        self._store.save(rec)

    def _heard(self, uid: int, done: asyncio.Future[int]) -> None:
        if not done.cancelled() and done.exception() is None:
            self._granted.add(uid)
        elif not done.cancelled() and isinstance(done.exception(), AccessDenied):
            self._granted.discard(uid)

    def _answered(self, uid: int) -> None:
        left = self._unanswered.get(uid, 0) - 1
        if left > 0:
            self._unanswered[uid] = left
        else:
            self._unanswered.pop(uid, None)

    async def _fence_ready(self, rec: AgentRecord, pid: int) -> None:
        for feature in self.features:
            if feature.holds_fence:
                await feature.on_fence(rec, pid)

    def _new_id(self) -> str:
        while True:
            agent_id = secrets.token_hex(4)
            if agent_id not in self.records and not self._store.known(agent_id):
                return agent_id

    def _scratch_image(self, eff: Effective, size: int) -> int | None:
        """The file of a namespace agent's scratch filesystem in the
        machine's scratch folder: one made ahead (sandbox/scratchpool.py),
        or an empty unnamed one (loopfs.prepare makes it an ext4); None
        where the scratch is a tmpfs or the folder cannot be had now (the
        held process then makes its own)."""
        if loopfs.backing() != "ext4":
            return None
        scratch_dir = eff.scratch_dir or DEFAULT_SCRATCH_DIR
        ready = self._scratch_pool.take(scratch_dir, size)
        if ready is not None:
            return ready
        try:
            dfd = scratch.open_root_dir(scratch_dir)
        except (Unavailable, OSError):
            return None
        try:
            return loopfs.unnamed_file(dfd)
        except OSError:
            return None
        finally:
            os.close(dfd)


_Step = Callable[[Starting, _Start, contextlib.AsyncExitStack], Awaitable[None]]

# A start, step by step (after firewalld's add_fail and sandbox/spec._STEPS):
# each takes one resource and registers its undo where it takes it, so a
# new resource is one step here, its undo beside it. Their order is the
# order they are taken in; a failure undoes the steps taken, the last first.
_START_STEPS: tuple[tuple[str, _Step], ...] = (
    ("fence hold", Starting._take_fence_hold),
    ("output pipes", Starting._take_output_pipes),
    ("scratch image", Starting._take_scratch_image),
    ("held child", Starting._fork_held),
    ("scope", Starting._start_scope),
    ("workdir and specs", Starting._check_and_plan),
    ("scratch", Starting._make_scratch),
    ("record", Starting._record),
    ("scope ready", Starting._scope_ready),
    ("features", Starting._start_features),
    ("containers", Starting._start_containers),
    ("release", Starting._release),
)

def _quietly(what: str, fn: Callable[..., object], *args: object) -> None:
    """An undo whose failure is logged: the start's own error is the one
    the caller hears, and the other undos still run."""
    with _logged(what):
        fn(*args)

def _reap_aborted(held: supervisor.Held) -> None:
    held.abort()
    with contextlib.suppress(ChildProcessError):
        os.waitpid(held.pid, 0)

async def _outcome(fut: asyncio.Future[None]) -> Exception | None:
    """Waits for `fut` to be over; what it failed with (None: it did not,
    or was cancelled)."""
    try:
        await fut
    except Exception as failed:
        return failed
    except BaseException:
        pass
    return None

def _settle(granted: concurrent.futures.Future[None], auth: asyncio.Future[int]) -> None:
    """Tells the planning thread (which waits on `granted` before anything
    costly) what polkit said."""
    if auth.cancelled():
        granted.set_exception(Unavailable("the request ended before polkit answered"))
    elif (exc := auth.exception()) is not None:
        granted.set_exception(exc)
    else:
        granted.set_result(None)

async def _refusal_first(auth: asyncio.Future[int], exc: BaseException | None) -> None:
    """Waits for polkit's answer and raises a refusal (or its failure) in
    place of whatever else went wrong: a caller polkit refuses learns only
    that."""
    try:
        await auth
    except Exception as refusal:
        if refusal is exc:
            # The start stopped on this very answer: it is no cause of itself.
            raise
        raise refusal from exc

def _limits(eff: Effective) -> ScopeLimits:
    r = eff.resources
    # The machine's defaults where no config set a limit: never an unbounded scope.
    got = resource_defaults.fill({
        "memory_max": r.memory_max, "tasks_max": r.tasks_max,
        "cpu_quota": r.cpu_quota, "cpu_weight": r.cpu_weight,
    })  # fmt: skip
    return ScopeLimits(
        memory_max=got["memory_max"], tasks_max=got["tasks_max"],
        cpu_quota_percent=got["cpu_quota"], cpu_weight=got["cpu_weight"],
    )

def _labelled_workdir(held: supervisor.Held) -> bool:
    """Whether an agent's processes ever wrote data above Internal in this
    workdir (its mark, policy/filelabels.py): then the new agent's fences
    wait until its opens there are watched, so a file labelled in an
    earlier run is not read unseen. Read through the descriptor the held
    child opened as the user."""
    try:
        fd = os.open(held.workdir_path(), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        mark = filelabels.dir_mark(fd)
    except OSError:
        return True  # unreadable: as if labelled
    finally:
        os.close(fd)
    return mark is not None and mark > Sensitivity.INTERNAL

async def _read_status(held: supervisor.Held) -> tuple[bool, str]:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    def readable() -> None:
        if not fut.done():
            fut.set_result(None)

    loopfd.add_fresh_reader(loop, held.status_r, readable)
    try:
        await asyncio.wait_for(fut, timeout=30)
    finally:
        loop.remove_reader(held.status_r)
    return supervisor.read_status(held.status_r)

def _copied_clients(
    kinds: list[SandboxKind], stdio: supervisor.Stdio
) -> tuple[int | None, int | None] | None:
    """For an attached agent the daemon can copy for (one namespace step,
    journald, dash, and a caller whose stdout and stderr are pipes): the
    daemon's own non-blocking copies of the caller's pipes (None for one
    nobody reads any more). None: it gets a supervisor, as before."""
    if (kinds not in ([SandboxKind.NAMESPACE], [SandboxKind.NONE])
            or stdio.stdout is None or stdio.stderr is None
            or not os.path.exists(journal.STDOUT_SOCKET) or _shared_shell() is None):
        return None
    out = output.private_pipe(stdio.stdout)
    if out is None:
        return None
    err = output.private_pipe(stdio.stderr)
    if err is None:
        if out >= 0:
            os.close(out)
        return None
    return (out if out >= 0 else None), (err if err >= 0 else None)

def _shared_shell(*, init: bool = False) -> int | None:
    """The daemon's sealed dash (or with `init`, catatonit), one for every agent."""
    from leviathd.sandbox.namespace import sealed

    try:
        return sealed.shared_sealed(
            sealed.INIT_CANDIDATES if init else sealed.SHELL_CANDIDATES)
    except OSError:
        return None


def _ensures(kinds: list[SandboxKind]) -> bool:
    """Some step's kind sets up resources of its own once the scope exists
    (sandbox/launchers.py `ensure`: the container kind)."""
    return any(launchers.launcher(k).ensure is not None for k in kinds)


async def _teardown(agent_id: str, kind: SandboxKind) -> None:
    """Undo a kind's `ensure` for a start that failed."""
    teardown = launchers.launcher(kind).teardown
    if teardown is not None:
        with _logged(f"agent {agent_id}: removing its {kind} after a failed start"):
            await teardown(agent_id)


# The errors whose refusal is a layer's (metrics.LAYERS), by class.
_REFUSING_LAYERS: tuple[tuple[type[BaseException], str], ...] = (
    (AccessDenied, "polkit"), (admission.Refused, "admission"), (Busy, "busy"),
)


def _count_failure(exc: BaseException) -> None:
    """A start that did not hold, in the figures (metrics.py): by its error's
    class (a fixed set of names, never the message) and, for a refusal, by
    the layer that refused."""
    if isinstance(exc, asyncio.CancelledError):
        return
    metrics.START_FAILURES.inc(type(exc).__name__)
    for cls, layer in _REFUSING_LAYERS:
        if isinstance(exc, cls):
            metrics.refused(layer)
            return


def _hook_files_given(plan: list[tuple[str, Effective, list[str]]], home: str) -> list[str]:
    out: list[str] = []
    for _label, eff, _argv in plan:
        for r in eff.hook_files_writable:
            with contextlib.suppress(InvalidArgument):
                out.append(expand(r, home))
    return list(dict.fromkeys(out))


def _hook_snapshot(agent_id: str, uid: int, gid: int,
                   tops: list[str]) -> hookwatch.Snapshot | None:
    """A worker's: never fails a start (the listing is told, not enforced)."""
    try:
        return hookwatch.snapshot(uid, gid, tops)
    except Exception as exc:  # (logged and skipped)
        journal.record(f"agent {agent_id}: its hook files could not be read ({exc}): "
                       "changes to them will not be listed", priority=syslog.LOG_WARNING,
                       LEVIATH_AGENT=agent_id)
        return None
