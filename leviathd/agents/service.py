"""The registry of agents and their life cycle: start (checked, fenced, in a
scope), stop, list, logs, and the end of every agent however it ends. Knows
nothing of D-Bus or polkit: the bus layer hands it a `Caller`, an `Authority`
to ask for the rights a call needs and a `CallerWatch` that tells when a
caller has gone; systemd comes as a `SystemdManager` object."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import secrets
import syslog
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from leviathd import listing, resource_defaults, safetext
from leviathd.agents import orphans, output
from leviathd.agents.request import RunInput, refuse_system_workdir
from leviathd.agents.usage import UsageCache
from leviathd.audit import trail as audit
from leviathd.audit.readers import CallerWatch, Readers
from leviathd.authority import Authority, Caller, Right
from leviathd.config import load as config_load
from leviathd.config.merge import DEFAULT_ENGINE, Effective, MergeResult, resolve
from leviathd.config.models import Blueprint, Config
from leviathd.domain.sandbox import SandboxKind
from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import (
    AccessDenied,
    Busy,
    ConfigError,
    InvalidArgument,
    NoSpace,
    NotFound,
    Unavailable,
)
from leviathd.events import Event
from leviathd.identity import UserInfo, user_info
from leviathd.policy import filelabels
from leviathd.records import FULL, AgentRecord, AgentState, RecordStore
from leviathd.sandbox import (
    container,
    fencehold,
    launchers,
    loopfs,
    scratch,
    supervisor,
    toolstate,
)
from leviathd.sandbox.container import pins as image_pins
from leviathd.sandbox.spec import (
    DEFAULT_SCRATCH_DIR,
    RunRequest,
    SandboxSpec,
    build_spec_on_host,
    hidden_paths,
    host_other_homes,
)
from leviathd.systemd import journal
from leviathd.systemd.manager import ScopeLimits, SystemdError, SystemdManager
from leviathd.userfiles import read_user_file

SLICE = "leviath.slice"
unit_name = safetext.unit_name
log = logging.getLogger(__name__)


Emit = Callable[..., None]
_UNPROBED = object()
NAMESPACE_STAND_IN = "LEVIATH_NAMESPACE_UNAVAILABLE"
_T = TypeVar("_T")
# Run requests of one uid being prepared or waiting to be (issue 22); also
# the starts of one uid holding a fork and a scope before polkit answered.
MAX_WAITING_PER_UID = 4
# How long preparation waits for polkit before an engine probe (the bus
# answers NoReply after 25 s).
AUTH_PATIENCE = 60.0
PLANNING_WORKERS = 4
# Connections told of one agent's end: its starter and those that asked
# since (Watch; a client that outlived a daemon restart). The newest are kept.
MAX_LISTENERS = 8


@dataclasses.dataclass(frozen=True)
class _Prepared:
    user: UserInfo
    merged: MergeResult
    command: list[str]
    agent_name: str
    plan: list[tuple[str, Effective, list[str]]]
    kinds: list[SandboxKind]
    marks: list[str]
    # Other accounts' homes (the fence hides them): read here, before the
    # scope's job, because with nss-systemd listing the accounts asks PID 1,
    # which during the job answers late (issue 18).
    other_homes: list[str]



@contextlib.contextmanager
def _logged(what: str) -> Iterator[None]:
    """Best-effort cleanup: whatever fails is logged with its traceback and
    the daemon goes on (it never ends over one agent's leftovers)."""
    try:
        yield
    except Exception:
        log.warning("%s failed", what, exc_info=True)

class Agents:
    def __init__(
        self,
        callers: CallerWatch,
        systemd: SystemdManager,
        store: RecordStore,
        *,
        authority: Authority,
        machine_config_path: str,
        scratch_dir_default: str,
        on_started: Emit,
        on_ended: Emit,
    ) -> None:
        self._authority = authority
        self._systemd = systemd
        self._store = store
        self._machine_path = machine_config_path
        self._scratch_default = scratch_dir_default
        # Each running namespace agent's scratch file, a copy kept by us
        # (sandbox/loopfs.py): closed once the agent has ended.
        self._images: dict[str, int] = {}
        self._on_started = on_started
        self._on_ended = on_ended
        self.machine_config = Config()
        self.records: dict[str, AgentRecord] = {}
        self._watches: dict[str, int] = {}
        # Attached agents whose output the daemon copies (agents/output.py).
        self._copies: dict[str, output.OutputCopy] = {}
        # List's memory and tasks figures, from memory (issue 18).
        self.usage = UsageCache(self._live_by_unit)
        self.readers = Readers(callers)
        self._finalizing: set[str] = set()
        # Records the state filesystem had no room for (a full disk): held
        # here, served from here, and written by maintain() once it has room.
        self.unsaved: dict[str, AgentRecord] = {}
        self._user_configs: dict[int, Config] = {}
        self._namespace_probe: object = _UNPROBED
        self._plan_pool = concurrent.futures.ThreadPoolExecutor(
            PLANNING_WORKERS, thread_name_prefix="leviath-plan"
        )
        self._plan_locks: dict[int, asyncio.Lock] = {}
        self._plan_waiting: dict[int, int] = {}
        # Per uid: starts holding a fork and a scope before polkit answered.
        self._unanswered: dict[int, int] = {}
        # Uids polkit last said yes to (to RUN, since the daemon started):
        # only their starts fork and start a scope before the answer.
        self._granted: set[int] = set()
        # Who hears an agent's AgentStarted/AgentEnded: the bus connection that
        # started it, and those that asked with Watch (not kept over a restart:
        # clients then ask again).
        self._signal_to: dict[str, list[str]] = {}
        # Set by the daemon where systemd is not PID 1: podman alone fences.
        self.podman_only = False
        # Set by the daemon when the machine config did not load at start:
        # then no agent starts (cleared by the first good load).
        self.config_problem: str | None = None
        # Extension points for other parts (the broker, containers).
        # spec_extensions: each step's spec passes through these before it is
        # recorded and released (e.g. to bind the agent's broker socket in).
        self.spec_extensions: list[Callable[[SandboxSpec], SandboxSpec]] = []
        # The same, for parts that depend on the step's effective settings
        # (the filtered container-engine socket, leviathd/enginesock).
        self.effective_spec_extensions: list[
            Callable[[SandboxSpec, Effective], SandboxSpec]
        ] = []
        # start_hooks run after the scope exists and before the agent is
        # released (a hook that raises aborts the start, leaving nothing);
        # end_hooks run when it has ended, before its scratch is removed.
        self.start_hooks: list[Callable[[AgentRecord, MergeResult, UserInfo], Awaitable[None]]] = []
        # Called with the pid of an agent's fence whose mounts are built and
        # which waits (sandbox/fencehold.py) before its command runs; raising
        # leaves it unanswered, so the fence fails.
        self.fence_hooks: list[Callable[[AgentRecord, int], Awaitable[None]]] = []
        self._holds: set[asyncio.Future[None]] = set()
        self.end_hooks: list[Callable[[AgentRecord], Awaitable[None]]] = [container.end_hook]
        # handover_hooks run when the held process has handed the agent to
        # its PID 1 and left (supervisor._hand_over); rec.supervisor_pid is
        # that PID 1.
        self.handover_hooks: list[Callable[[AgentRecord], None]] = []

    # --- configuration -----------------------------------------------------

    def load_machine_config(self) -> None:
        """Raises ConfigError and keeps the old config when the file is bad."""
        self._namespace_probe = _UNPROBED
        # With /etc/leviath/rules.d (root's files only), checked as one: a
        # bad file there keeps the old configuration like a bad config.toml.
        self.machine_config = config_load.load_machine(self._machine_path)
        self.config_problem = None
        # The container kind runs the ID the machine's image has now, not
        # whatever its tag names later (sandbox/container/pins.py).
        ms = self.machine_config.sandbox
        image_pins.reload({(str(ms.engine or DEFAULT_ENGINE), ms.image)}
                          if ms is not None and ms.image else set())

    async def reload(self) -> None:
        """The bus edge has checked org.leviath.config.manage."""
        self.load_machine_config()
        journal.record("configuration reloaded", LEVIATH_EVENT=Event.RELOAD)

    def user_config(self, user: UserInfo) -> Config | None:
        path = os.path.join(user.home, ".config", "leviath", "config.toml")
        try:
            text = read_user_file(path, user.uid, user.gid, limit=config_load.MAX_TEXT_BYTES)
        except PermissionError as exc:
            raise ConfigError(str(exc)) from None
        if text is None:
            self._user_configs.pop(user.uid, None)
            return None
        try:
            config = config_load.parse_config(text, path)
        except ConfigError as exc:
            last_good = self._user_configs.get(user.uid)
            if last_good is None:
                raise
            # As with the machine file: a broken edit leaves the last good
            # configuration in force, and says so where the admin looks.
            journal.record(
                f"{path} does not load; the last good version stays in force: {exc}",
                priority=syslog.LOG_ERR, LEVIATH_EVENT=Event.RELOAD_FAILED, LEVIATH_USER=user.name,
            )
            return last_good
        self._user_configs[user.uid] = config
        return config

    # --- start -------------------------------------------------------------

    async def run(self, who: Caller, req: RunInput, stdio: supervisor.Stdio) -> AgentRecord:
        try:
            if self.config_problem:
                raise ConfigError(self.config_problem)
            return await self._run(who, req, stdio)
        except OSError as exc:
            # The scratch folder or a record that did not fit: the caller is
            # told where space is missing, not "internal error".
            if exc.errno in FULL:
                raise NoSpace(str(self._store.dir.parent), exc.strerror or "") from None
            raise
        finally:
            # The supervisor has its own copies; ours must not leak.
            for fd in stdio.fds():
                with contextlib.suppress(OSError):
                    os.close(fd)

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

    async def _start(
        self, who: Caller, req: RunInput, stdio: supervisor.Stdio, auth: asyncio.Future[int]
    ) -> AgentRecord:
        t0 = time.perf_counter()
        granted: concurrent.futures.Future[None] = concurrent.futures.Future()
        auth.add_done_callback(lambda done: _settle(granted, done))
        p = await self._in_worker(who.uid, self._prepare, who.uid, req,
                                  lambda: granted.result(timeout=AUTH_PATIENCE))  # fmt: skip
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
        user, merged, command, agent_name = p.user, p.merged, p.command, p.agent_name
        eff, plan, kinds, marks = merged.agent, p.plan, p.kinds, p.marks
        # Here, not when the request is parsed: from here on the caller's
        # descriptors are closed however the request ends.
        refuse_system_workdir(req.workdir, user.home)

        agent_id = self._new_id()
        unit = unit_name(user.name, agent_name, agent_id)
        # Each namespace fence may have to wait for the daemon's marks
        # (sandbox/fencehold.py): decided once the workdir is known.
        needs = launchers.held_needs(kinds)
        hold = fencehold.pair() if needs.fence_hold and self.fence_hooks else None
        # An attached one-command namespace agent whose caller gave pipes:
        # the daemon copies its output, no supervisor stays (agents/output.py).
        copy: output.OutputCopy | None = None
        held_stdio = stdio
        clients = (_copied_clients(kinds, stdio) if len(self._copies) < output.budget()
                   else None)
        if clients is not None:
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            held_stdio = supervisor.Stdio(stdin=stdio.stdin, stdout=out_w, stderr=err_w,
                                          kept=(out_r, err_r))
        image = self._scratch_image(eff) if needs.scratch_image else None
        try:
            held = supervisor.fork_held(
                user, req.workdir, exit_path=self._store.exit_path(agent_id),
                identifier=safetext.AGENT_IDENTIFIER, unit=unit, stdio=held_stdio,
                shell=_shared_shell() if needs.shell else None,
                init=_shared_shell(init=True) if needs.init else None,
                hold=hold[1].fileno() if hold else None, image=image,
            )
        except BaseException:
            if image is not None:
                os.close(image)
            if hold:
                hold[0].close()
            if clients is not None:
                for fd in (out_r, out_w, err_r, err_w, *clients):
                    if fd is not None:
                        os.close(fd)
            raise
        finally:
            if hold:
                hold[1].close()
        if clients is not None:
            assert held_stdio.kept is not None
            for fd in (held_stdio.stdout, held_stdio.stderr):
                if fd is not None:
                    os.close(fd)
            copy = output.OutputCopy(agent_id, unit, user.uid, user.gid, held_stdio.kept,
                                     clients, zombie=held.pid)
        holding = False
        scratch_path = ""
        scope_usec = 0

        async def start_scope() -> None:
            nonlocal scope_usec
            t_scope = time.perf_counter()
            await self._systemd.start_scope(
                unit, pids=[held.pid], slice_name=SLICE,
                description=safetext.description(
                    f"leviath agent {agent_name} of {safetext.escape(user.name, 64)} ({agent_id})"
                ),
                limits=_limits(eff),
            )
            scope_usec = int((time.perf_counter() - t_scope) * 1e6)

        # The scope's job (systemd's share of a start, the longest single
        # wait) runs while the workdir is checked and the specs are built:
        # neither depends on it, and the held child runs nothing until it is
        # released below, inside the scope (issue 18).
        scope = asyncio.ensure_future(start_scope())
        try:
            try:
                ok, detail = await _read_status(held)
                if not ok:
                    raise InvalidArgument(detail)
                real_workdir = detail
                # Again as resolved: a link in the user's home may lead to /etc.
                refuse_system_workdir(real_workdir, user.home)
                holding = hold is not None and _labelled_workdir(held)
                # Specs look at the user's workdir (a worktree's git folders...).
                steps = await self._in_worker(
                    who.uid, self._specs, plan, kinds, user, req, real_workdir, agent_id,
                    p.other_homes, lambda: granted.result(timeout=AUTH_PATIENCE))
                polkit_usec = await auth
            except BaseException as exc:
                # The scope's start is over (either way) before the clean-up
                # below stops it: a stop sent first would leave it behind.
                scope_exc: BaseException | None = None
                try:
                    await scope
                except Exception as failed:
                    scope_exc = failed
                except BaseException:
                    pass
                # A scope that failed kills what it held: then the held
                # process "ended before it was ready" because of this.
                if (scope_exc is not None and isinstance(exc, InvalidArgument)
                        and str(exc) == supervisor.ENDED_EARLY):  # fmt: skip
                    raise scope_exc from exc
                raise
            for _label, spec in steps:
                if spec.kind == SandboxKind.NAMESPACE and not scratch_path:
                    scratch_path = scratch.create(spec)
            rec = AgentRecord(
                id=agent_id, uid=user.uid, user=user.name, agent=agent_name,
                command=command or plan[-1][2], workdir=real_workdir, unit=unit,
                sandbox="+".join(dict.fromkeys(kinds)), marks=marks,
                reads_granted=len(eff.read_paths_granted),
                reads_declared=len(eff.read_paths_declared),
                supervisor_pid=held.pid, scratch=scratch_path, started_at=time.time(),
                blueprint=(req.blueprint_source if req.blueprint_text is not None
                           and req.blueprint_source.startswith("/") else ""),
            )
            # Without containers the steps are final here: the spec and the
            # record (each written and fsynced, a few ms) are written while
            # systemd's job still runs (issue 18), not after it.
            early = not any(launchers.launcher(k).ensure for k in kinds)
            if early:
                self._save_start(rec, [(label, spec.to_dict()) for label, spec in steps])
            await scope
            for hook in self.start_hooks:
                await hook(rec, merged, user)
            # A kind's own resources (containers) are set up once the scope
            # exists (their cgroups sit below it) and after the hooks (whose
            # folders they bind, such as the broker's). Steps with identical
            # settings share one.
            started: set[str] = set()
            for n, ((_label, step_eff, _argv), (label, spec)) in enumerate(
                zip(plan, steps, strict=True)
            ):
                ensure = launchers.launcher(spec.kind).ensure
                if ensure is not None:
                    steps[n] = (label, await ensure(
                        agent_id, unit, spec, step_eff, units=self._systemd, started=started,
                        pinned_workdir=held.workdir_path(),
                    ))
            spec_dicts = [(label, spec.to_dict()) for label, spec in steps]
            if not early:
                self._save_start(rec, spec_dicts)
            try:
                supervisor.release(held, spec_dicts, hold=holding)
            except BrokenPipeError as exc:
                # Gone since it said its workdir was fine: nothing of it runs,
                # so nothing of it may stay (its record, scratch, scope).
                raise Unavailable(supervisor.ENDED_EARLY) from exc
        except BaseException:
            if image is not None:
                os.close(image)  # nothing was written to it yet
            if hold:
                hold[0].close()
            if copy is not None:
                copy.close()
            held.abort()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(held.pid, 0)
            with contextlib.suppress(SystemdError, OSError):
                await self._systemd.stop_unit(unit)
            if scratch_path:
                scratch.remove(scratch_path)
            for step_kind in dict.fromkeys(kinds):
                teardown = launchers.launcher(step_kind).teardown
                if teardown is not None:
                    with _logged(f"agent {agent_id}: removing its {step_kind} after a failed "
                                 "start"):
                        await teardown(agent_id)
            self._store.forget(agent_id)
            raise
        self.records[agent_id] = rec
        if image is not None:
            self._images[agent_id] = image
        if hold and holding:
            task = asyncio.ensure_future(
                fencehold.serve(hold[0], lambda pid: self._fence_ready(rec, pid)))
            self._holds.add(task)
            task.add_done_callback(self._holds.discard)
        elif hold:
            hold[0].close()
        kind = rec.sandbox
        spawn_usec = int((time.perf_counter() - t0) * 1e6)
        if copy is not None:
            self._copies[agent_id] = copy
        self._await_handover(rec, held)
        self.usage.seed(rec.id, rec.unit, cgroup=f"/{SLICE}/{unit}")
        journal.record(
            f"agent {agent_id} ({agent_name}) started for {user.name} in {unit}",
            LEVIATH_AGENT=agent_id, LEVIATH_USER=user.name, LEVIATH_UNIT=unit,
            LEVIATH_SANDBOX=kind, LEVIATH_EVENT=Event.START, LEVIATH_SPAWN_USEC=spawn_usec,
            LEVIATH_POLKIT_USEC=polkit_usec, LEVIATH_SCOPE_USEC=scope_usec,
        )
        if rec.reads_declared and not rec.reads_granted:
            journal.record(
                f"agent {agent_id} ({agent_name}) declares {rec.reads_declared} read paths and "
                "the configuration grants none: reads outside the workdir will be refused",
                priority=syslog.LOG_WARNING, LEVIATH_AGENT=agent_id,
                LEVIATH_EVENT=Event.READS_NOT_GRANTED,
            )
        self._signal_to[agent_id] = [who.sender]
        self._on_started(agent_id, unit, user.uid, to=who.sender)
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
        for hook in self.fence_hooks:
            await hook(rec, pid)

    # --- planning, off the event loop ------------------------------------

    async def _in_worker(self, uid: int, fn: Callable[..., _T], *args: object) -> _T:
        """Run `fn` in the planning pool, one call per uid at a time and at
        most MAX_WAITING_PER_UID waiting: a caller's slow request (a large
        blueprint, a slow engine) delays only that caller's next ones."""
        waiting = self._plan_waiting.get(uid, 0)
        if waiting >= MAX_WAITING_PER_UID:
            raise Busy(f"uid {uid} has {waiting} requests being prepared; try again later")
        self._plan_waiting[uid] = waiting + 1
        try:
            lock = self._plan_locks.setdefault(uid, asyncio.Lock())
            async with lock:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self._plan_pool, lambda: fn(*args))
        finally:
            left = self._plan_waiting[uid] - 1
            if left:
                self._plan_waiting[uid] = left
            else:
                del self._plan_waiting[uid]
                self._plan_locks.pop(uid, None)

    def _prepare(
        self, uid: int, req: RunInput, authorized: Callable[[], None] = lambda: None
    ) -> _Prepared:
        """Who, what and in which sandbox kinds: name lookups, the user's
        config file, the blueprint's parsing and merge, and the engine's and
        image's checks (blocking, in a worker). `authorized` returns once
        polkit said yes (raises otherwise): asked before an engine probe or
        a warning in the journal, which a refused caller must not cause."""
        user = user_info(uid)
        blueprint: Blueprint | None = None
        if req.blueprint_text is not None:
            blueprint = config_load.parse_blueprint(req.blueprint_text, req.blueprint_source)
        command = list(req.command) or list(blueprint.agent.command or [] if blueprint else [])
        # argv[0] is the user's to choose, newlines and all: it becomes a name
        # by the blueprint rules before systemd or journald sees any of it.
        agent_name = (
            safetext.check_name(blueprint.agent.name) if blueprint
            else safetext.agent_name(command[0] if command else "")
        )
        merged = resolve(self.machine_config, self.user_config(user), blueprint, agent_name)
        errors = [f for f in merged.findings if f.level == "error"]
        if errors:
            raise InvalidArgument("; ".join(f"[{f.code}] {f.message}" for f in errors))
        plan = _plan(merged, command, agent_name)
        if not plan:
            raise InvalidArgument("nothing to run: the blueprint has no [agent] command, no "
                                  "stages, and no command was given")
        kinds: list[SandboxKind] = []
        marks: list[str] = []
        # One engine and image check per distinct (engine, image), not per step.
        probes: dict[tuple[str, str], str | None] = {}

        def probe(step_eff: Effective) -> str | None:
            key = (str(step_eff.engine), str(step_eff.image))
            if key not in probes:
                authorized()
                probes[key] = launchers.launcher(SandboxKind.CONTAINER).probe(step_eff)
            return probes[key]

        for _label, step_eff, _argv in plan:
            kind, step_marks = self._choose_kind(step_eff, req, probe, authorized)
            kinds.append(kind)
            # `lev ps` shows a network other than the host's (net:proxy is the
            # default since issue 30).
            if kind == SandboxKind.NAMESPACE and step_eff.network == "proxy":
                step_marks = [*step_marks, "net:proxy"]
            elif kind != SandboxKind.NONE and step_eff.network is not True:
                step_marks = [*step_marks, "net:none"]
            marks += [m for m in step_marks if m not in marks]
        other_homes = host_other_homes(user)
        return _Prepared(user, merged, command, agent_name, plan, kinds, marks, other_homes)

    def _specs(
        self, plan: list[tuple[str, Effective, list[str]]], kinds: list[SandboxKind],
        user: UserInfo,
        req: RunInput, workdir: str, agent_id: str, other_homes: list[str] | None = None,
        authorized: Callable[[], None] = lambda: None,
    ) -> list[tuple[str, SandboxSpec]]:
        self._tool_state(plan, kinds, user, other_homes or [], authorized)
        return [
            (label, self._spec(step_eff, kind, user, req, argv, workdir, agent_id, other_homes))
            for (label, step_eff, argv), kind in zip(plan, kinds, strict=True)
        ]

    def _tool_state(
        self, plan: list[tuple[str, Effective, list[str]]], kinds: list[SandboxKind],
        user: UserInfo,
        other_homes: list[str], authorized: Callable[[], None],
    ) -> None:
        """The agent tools' state missing on the host is made, as the user,
        before the specs bind what exists (sandbox/toolstate.py). Only for a
        fence: kind none runs in the real home already."""
        fenced = [(eff, argv) for (_l, eff, argv), kind in zip(plan, kinds, strict=True)
                  if kind != SandboxKind.NONE]
        if not fenced:
            return
        hidden = sorted({h for eff, _argv in fenced for h in hidden_paths(
            user, eff.hidden_paths, scratch_dir=eff.scratch_dir or DEFAULT_SCRATCH_DIR,
            other_homes=other_homes)})
        notes = toolstate.prepare(user.uid, user.gid, user.home,
                                  [argv for _eff, argv in fenced], hidden, authorized)
        for note in notes:
            journal.record(f"agent tools' state for {user.name}: {note}",
                           priority=syslog.LOG_WARNING)

    def _choose_kind(
        self, eff: Effective, req: RunInput, probe: Callable[[Effective], str | None],
        authorized: Callable[[], None],
    ) -> tuple[SandboxKind, list[str]]:
        if self.podman_only:
            # No systemd to hold a scope: the container is the fence and the
            # limits (see daemon.py and docs/containers.md).
            reason = probe(eff)
            if reason is not None:
                raise Unavailable(f"without systemd, agents run only in containers: {reason}")
            return SandboxKind.CONTAINER, ["no-systemd"]
        if req.sandbox == SandboxKind.NONE:
            return SandboxKind.NONE, ["unsandboxed"]
        kind = SandboxKind(eff.kind)
        if kind == SandboxKind.NONE:
            return SandboxKind.NONE, ["unsandboxed"]
        if kind == SandboxKind.NAMESPACE:
            reason = self.namespace_problem()
            if reason is None:
                return SandboxKind.NAMESPACE, []
            # A container is at least as strict as the fence: use it when it works.
            fallback_problem = probe(eff)
            if fallback_problem is None:
                authorized()
                journal.record(
                    f"the namespace fence cannot be built here ({reason}); falling back to the "
                    "container kind",
                    priority=syslog.LOG_WARNING, LEVIATH_EVENT=Event.SANDBOX_FALLBACK,
                )
                return SandboxKind.CONTAINER, ["fallback:container"]
            reason = f"{reason}; nor can the container fallback: {fallback_problem}"
        else:
            reason = probe(eff)
            if reason is None:
                return SandboxKind.CONTAINER, []
        on_unavailable = str(eff.on_unavailable)
        if on_unavailable == "warn":
            authorized()
            journal.record(
                f"sandbox {kind} unavailable ({reason}); running on the host as configured "
                "(on_unavailable = \"warn\")",
                priority=syslog.LOG_WARNING, LEVIATH_EVENT=Event.SANDBOX_UNAVAILABLE,
            )
            return SandboxKind.NONE, ["unsandboxed", f"{kind}-unavailable"]
        raise Unavailable(f"the {kind} sandbox cannot be built here: {reason}")

    def namespace_problem(self) -> str | None:
        """Why the namespace fence cannot be built here (None: it can). Asked
        once, then again on reload: the answer is the host's, not the run's."""
        if self._namespace_probe is _UNPROBED:
            self._namespace_probe = launchers.launcher(SandboxKind.NAMESPACE).probe(None)
            if self._namespace_probe is None and os.environ.get(NAMESPACE_STAND_IN):
                # A test stand-in: a host whose kernel refuses the fence while
                # podman still works cannot be made on demand in the test bed.
                self._namespace_probe = f"disabled by {NAMESPACE_STAND_IN} (test stand-in)"
        return self._namespace_probe  # type: ignore[return-value]

    def _spec(
        self, eff: Effective, kind: SandboxKind, user: UserInfo, req: RunInput, command: list[str],
        workdir: str, agent_id: str, other_homes: list[str] | None = None,
    ) -> SandboxSpec:
        request = RunRequest(
            argv=tuple(command), workdir=workdir,
            workdir_mode=req.workdir_mode,  # type: ignore[arg-type]  # checked in from_variants
            env=dict(req.env),
        )
        eff = dataclasses.replace(eff, kind=kind)
        spec = build_spec_on_host(eff, user, request, agent_id, other_homes)
        for extend in self.spec_extensions:
            spec = extend(spec)
        for extend_eff in self.effective_spec_extensions:
            spec = extend_eff(spec, eff)
        return spec

    def _new_id(self) -> str:
        while True:
            agent_id = secrets.token_hex(4)
            if agent_id not in self.records and not self._store.known(agent_id):
                return agent_id

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
                for hook in self.handover_hooks:
                    with _logged(f"agent {rec.id}: handover hook"):
                        hook(rec)
            self._watch(rec)
            if supervising:
                self._hear_end(rec.id, held.status_r)

        loop.add_reader(held.status_r, readable)

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

        loop.add_reader(status_r, readable)

    def _reap_later(self, pid: int) -> None:
        """Our held child, which is leaving: reap it when it has."""
        output.reap_when_gone(pid)

    def _watch(self, rec: AgentRecord) -> None:
        """Learn of the supervisor's end through a pidfd, which works whether
        or not this daemon is its parent (after a restart it is not)."""
        try:
            pidfd = os.pidfd_open(rec.supervisor_pid)
        except ProcessLookupError:
            asyncio.get_running_loop().create_task(self._finalize(rec.id))
            return
        if not _supervisor_alive(rec):
            # A handed-over PID 1 that ended (and whose pid is reused):
            # the pidfd is pinned now, so this check holds.
            os.close(pidfd)
            asyncio.get_running_loop().create_task(self._finalize(rec.id))
            return
        self._watches[rec.id] = pidfd
        asyncio.get_running_loop().add_reader(pidfd, self._supervisor_ended, rec.id)

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
                scratch.remove(rec.scratch)
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
            if image is not None:
                # The last copy of the scratch's file, closed in a worker:
                # freeing its blocks (with the host's discards) is slow disk
                # work, which the agent's own end no longer waits for.
                await asyncio.to_thread(os.close, image)
            # Whatever the agent left behind in its scope ends with it.
            with _logged(f"agent {agent_id}: stopping {rec.unit} after its end"):
                await self._systemd.stop_unit(rec.unit)
            for hook in self.end_hooks:
                with _logged(f"agent {agent_id}: end hook {getattr(hook, '__qualname__', hook)}"):
                    await hook(rec)
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
                if self.unsaved:
                    self.write_unsaved()
                if any(r.state is AgentState.UNKNOWN for r in self.records.values()):
                    await self.reconcile()
                if loop.time() >= next_retention:
                    next_retention = loop.time() + retention_every
                    self.apply_retention()
            except Exception:
                log.exception("record maintenance failed; trying again later")

    def _save(self, rec: AgentRecord) -> bool:
        """Write a record; when the state filesystem is full, hold it in
        memory instead (served from there) until write_unsaved() can."""
        try:
            self._store.save(rec)
        except NoSpace as exc:
            if rec.id not in self.unsaved:
                journal.record(
                    f"agent {rec.id}: {exc}; its record ({rec.state.value}) is kept in memory "
                    "and written when space returns",
                    priority=syslog.LOG_ERR, LEVIATH_AGENT=rec.id,
                    LEVIATH_EVENT=Event.RECORD_UNSAVED,
                )
            self.unsaved[rec.id] = rec
            if not rec.active:
                self._store.index_ended(rec)
            return False
        self.unsaved.pop(rec.id, None)
        return True

    def write_unsaved(self) -> None:
        for rec in list(self.unsaved.values()):
            if not self._save(rec):
                return
            if not rec.active:
                self._store.drop_exit(rec.id)
            journal.record(
                f"agent {rec.id}: its record ({rec.state.value}) is written now",
                LEVIATH_AGENT=rec.id, LEVIATH_EVENT=Event.RECORD_SAVED,
            )

    def _scratch_image(self, eff: Effective) -> int | None:
        """An empty unnamed file for a namespace agent's scratch filesystem
        in the machine's scratch folder (loopfs.make fills it in the agent's
        held process); None where the scratch is a tmpfs or the folder
        cannot be had now (the held process then makes its own)."""
        if loopfs.backing() != "ext4":
            return None
        try:
            dfd = scratch.open_root_dir(eff.scratch_dir or DEFAULT_SCRATCH_DIR)
        except (Unavailable, OSError):
            return None
        try:
            return loopfs.unnamed_file(dfd)
        except OSError:
            return None
        finally:
            os.close(dfd)

    def _scratch_dirs(self) -> list[str]:
        dirs = {self._scratch_default}
        configured = getattr(self.machine_config.sandbox, "scratch_dir", None)
        if configured:
            dirs.add(str(configured))
        return sorted(dirs)

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

    async def _live_by_unit(self, _agent_id: str, unit: str) -> tuple[dict[str, int | None], str]:
        state = await self._systemd.unit_state(unit)
        if state is None:
            return {}, ""
        return {
            "memory": state.memory_current, "tasks": state.tasks_current,
            "memory_max": state.memory_max, "tasks_max": state.tasks_max,
        }, state.control_group  # fmt: skip

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
            self._on_ended(rec.id, status, rec.state.value, to=to)

    async def list(
        self, who: Caller, *, include_ended: bool, cursor: str = "",
        limit: int = listing.DEFAULT_ROWS, budget: int = listing.REPLY_BUDGET,
    ) -> tuple[list[tuple[AgentRecord, dict[str, int | None]]], str]:
        """One page: agents that run (oldest first), then, with include_ended,
        ended ones (most recent first), at most `limit` rows and about `budget`
        bytes. Returns the rows and the cursor of the next page ("" at the end)."""
        everyone = await self._authority.allowed(who, Right.MANAGE_ANY)
        after = listing.parse_cursor(cursor)
        keys: list[tuple[listing.Key, str]] = [
            (listing.running_key(r.started_at, r.id), r.id) for r in self.records.values()
            if r.active and (everyone or r.uid == who.uid)
        ]
        if include_ended:
            keys += [
                (listing.ended_key(e.ended_at, e.id), e.id) for e in self._store.ended.values()
                if everyone or e.uid == who.uid
            ]
        keys = sorted(k for k in keys if after is None or k[0] > after)
        page = listing.Page(limit=limit, budget=budget)
        for key, agent_id in keys:
            rec = (self.records.get(agent_id) if key[0] == 0
                   else self.unsaved.get(agent_id) or self._store.load(agent_id))
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


def _plan(
    merged: MergeResult, command: list[str], agent_name: str
) -> list[tuple[str, Effective, list[str]]]:
    """What the agent runs, in order: the blueprint's seed commands, then its
    stages (each with its own effective settings) or its command. A command
    given with the request replaces the stages and the blueprint's command."""
    eff = merged.agent
    plan = [(f"seed {i + 1}", eff, list(argv)) for i, argv in enumerate(merged.seed)]
    if command:
        plan.append((agent_name, eff, command))
    elif merged.stages:
        plan += [(f"stage {name}", st, list(st.command)) for name, st in merged.stages.items()]
    return plan


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

    loop.add_reader(held.status_r, readable)
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
