"""The per-agent broker: every tool call goes gate → (person) → tool →
ledger, and every decision becomes an audit record."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import syslog
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

from leviathd.broker import gitcreds, localfs, resolve, schema
from leviathd.broker.credentials import CredentialRunner, read_secret, run_credential
from leviathd.broker.limits import too_large
from leviathd.broker.net import AddressRefused
from leviathd.broker.opener import Opener, OpenFailed
from leviathd.broker.rulelane import Lane, Lanes
from leviathd.broker.tools import (
    READ_FLAGS,
    ArgvRequest,
    ArgvRunner,
    FileTools,
    RawJSON,
    RealPathRefused,
    ShellRequest,
    ShellRunner,
    web_tool,
)
from leviathd.broker.writewatch import TooBusy, WriteWatch
from leviathd.domain.brokerlimits import Limits
from leviathd.domain.sensitivity import Sensitivity
from leviathd.domain.tools import TOOLS, SendsOut, ToolKind
from leviathd.errors import AccessDenied, LeviathError, LimitExceeded, NotFound, Unavailable
from leviathd.events import Event
from leviathd.identity import UserInfo
from leviathd.policy import filelabels
from leviathd.policy.approvals import Answer, ApprovalQueue, OnceApproval
from leviathd.policy.decision import ApprovalView, Call, Decision, Facts, decide, rule_views
from leviathd.policy.ledger import Ledger
from leviathd.policy.rules import RuleResult
from leviathd.policy.settings import CompiledPolicy, PolicySettings
from leviathd.policy.tooldef import check_args, command_line, render
from leviathd.readpatterns import is_inside
from leviathd.systemd import journal


@dataclass(frozen=True)
class AuditRecord:
    agent: str
    user: str
    uid: int
    tool: str
    target: str
    taint: str
    clearance: str
    rule: str
    outcome: str  # allow | deny | ask | error
    detail: str = ""
    at: float = 0.0

    def journal_fields(self) -> dict[str, str]:
        """Fields for the journal; `journalctl LEVIATH_AGENT=<id>` finds them."""
        return {f"LEVIATH_{k.upper()}": str(v) for k, v in asdict(self).items() if k != "at"}


AuditSink = Callable[[AuditRecord], None]
T = TypeVar("T")
# How many read_files take the pool's path at once after one whose file
# system's checks had to be made in the pool (Broker._pool_reads).
POOL_READS = 32

# Bytes of a reply that are not the result: ok, label, entry, taint, id.
ENVELOPE = 512


class ToolRefused(LeviathError):
    def __init__(self, message: str, rule: str) -> None:
        super().__init__(message)
        self.rule = rule


class Broker:
    """One per running agent, created by the daemon. `call` never trusts the
    caller's identity: the server has already tied the connection to this
    agent by the peer's credentials and cgroup."""

    def __init__(
        self,
        *,
        agent_id: str,
        user: UserInfo,
        workdir: str,
        settings: PolicySettings,
        ledger: Ledger,
        approvals: ApprovalQueue,
        audit: AuditSink,
        shell: ShellRunner | None = None,
        credential: CredentialRunner | None = None,
        agent_facts: Mapping[str, Any] | None = None,
        tool_runner: ArgvRunner | None = None,
        stage: Callable[[], str] | None = None,
        lane: Lane | None = None,
        fence: Callable[[], int | None] | None = None,
    ) -> None:
        self.agent_id = agent_id
        # A pidfd on PID 1 of the agent's running fence (sandbox/join.py), or
        # None for an agent without one (sandbox none: the host's view is its
        # view). Blocking; raises Unavailable between two steps.
        self._fence = fence
        # The file tools' worker, in that fence's mounts (issue 43): made
        # and replaced in the agent's pool threads, hence the lock.
        self._view: Opener | None = None
        self._view_lock = threading.Lock()
        # Where this user's rules take their turns (broker/rulelane.py): the
        # daemon gives all brokers of one user the same lane.
        self._lane = lane or Lanes().lane(user.uid)
        # What policy rules see of the agent (gate.Facts).
        self.agent_facts: Mapping[str, Any] = agent_facts or {"id": agent_id, "user": user.name}
        # A container step has a view of its own (the container's mounts:
        # protected files read-only) that the file tools do not enter yet:
        # writes there would act in the host's view, past the container's
        # protections, so they are refused (reads stay within the grants).
        self.host_view_writes = "container" not in str(
            self.agent_facts.get("sandbox", "")).split("+")
        self.user = user
        self.ledger = ledger
        self.approvals = approvals
        self.audit = audit
        self._shell = shell
        self._credential = credential
        self._tool_runner = tool_runner
        # The stage the agent runs now (agent.stage in rules), asked per call.
        self._stage = stage
        self._opener: Opener | None = None
        # The cgroup of an agent process that called (set by the server from
        # the kernel's word): where the file worker runs, so its cost is the
        # agent's.
        self.scope_cgroup: str | None = None
        # The pid of that process (same source), for finding its mounts.
        self.caller_pid: int | None = None
        # Labels on what the agent's own processes write while tainted.
        self.write_watch = WriteWatch(agent_id, lambda: self.ledger.taint,
                                      on_label=self._labelled,
                                      on_read=self._read_in_sandbox)
        self._watch_failure: str | None = None
        self._in_flight = 0
        self._pool: ThreadPoolExecutor | None = None
        # Reads left to take the pool's path at once (_read_ahead_on_loop):
        # after a file whose checks could not be made on the loop, the next
        # ones are likely on the same file system, where the loop's path
        # would add its own wait to the pool's hop.
        self._pool_reads = 0
        # Files the agent wrote while its taint was above Internal, with that
        # taint: reading them back carries it again (no laundering through
        # the workdir). Keyed by (st_dev, st_ino), which survives renames.
        self._tainted_files: dict[tuple[int, int], Sensitivity] = {}
        # Issue 30: set by the proxy for an agent whose git credentials are
        # injected at the egress: the git tools give the agent this
        # placeholder (by credential name) instead of the token.
        self.placeholder_for: Callable[[str], str | None] | None = None
        self.policy = self._compile(settings, workdir)

    def _compile(self, settings: PolicySettings, workdir: str) -> CompiledPolicy:
        policy = CompiledPolicy(settings, home=self.user.home, workdir=workdir)
        self.ledger.set_budget(settings.budget)
        self.approvals.timeout = settings.approval_timeout
        self.approvals.max_pending = settings.limits.max_pending_approvals
        return policy

    @property
    def limits(self) -> Limits:
        return self.policy.settings.limits

    def enter(self) -> None:
        """Take one of the agent's concurrent call slots (held until the
        reply is written), or refuse by name."""
        limit = self.limits.max_concurrent_calls
        if self._in_flight >= limit:
            raise too_large("max_concurrent_calls", limit, "too many calls in flight at once")
        self._in_flight += 1

    def leave(self) -> None:
        self._in_flight = max(0, self._in_flight - 1)

    # -- life cycle ------------------------------------------------------

    def reload(self, settings: PolicySettings) -> None:
        """New settings (config reload): recompiled here, used by the next call."""
        if settings.budget < len(self.ledger):
            self._settle_writes()  # a smaller budget pushes entries out
        self.policy = self._compile(settings, self.policy.workdir)
        if self.ledger.taint <= Sensitivity.INTERNAL:
            self.write_watch.release()

    def start(self) -> None:
        """Start the opener process (as the agent's user)."""
        if self._opener is None:
            self._opener = Opener(uid=self.user.uid, gid=self.user.gid, groups=self.user.groups,
                                  cgroup=self.scope_cgroup,
                                  max_data=self.limits.request_max_bytes)

    async def credential_secret(self, name: str) -> str:
        """The secret of credential `name`, read as `read_secret` does (for
        the proxy's injection: it goes into a request, never to the agent)."""
        spec = self.policy.settings.credentials.get(name)
        if spec is None:
            raise LookupError(f"no credential named {name!r} is configured")
        self.start()
        assert self._opener is not None
        return await read_secret(spec, opener=self._opener, uid=self.user.uid,
                                 gid=self.user.gid, groups=self.user.groups,
                                 home=self.user.home)

    def _drop_opener(self) -> None:
        if self._opener is not None:
            self._opener.close()
            self._opener = None
        self._drop_view()

    def _drop_view(self) -> None:
        with self._view_lock:
            if self._view is not None:
                self._view.close()
                self._view = None

    def files_opener(self) -> Opener:
        """The opener the file tools (and a blueprint tool's path arguments)
        decide and act through: one whose worker entered the agent's own
        mount namespace, so they see what the agent sees and no more (issue
        43); the host's for an agent without a fence of its own. Blocking
        (run in the agent's pool); `start` has run."""
        with self._view_lock:
            if self._view is not None and self._view.stale():
                self._view.close()  # that fence ended: a new step's is looked up
                self._view = None
            if self._view is None and self._fence is not None:
                pidfd = self._fence()
                if pidfd is not None:
                    self._view = Opener(uid=self.user.uid, gid=self.user.gid,
                                        groups=self.user.groups, cgroup=self.scope_cgroup,
                                        max_data=self.limits.request_max_bytes, fence=pidfd)
            if self._view is not None:
                return self._view
        assert self._opener is not None
        return self._opener

    def write_opener(self) -> Opener:
        """files_opener for a write: refused where it would be the host's
        view of a container agent (see host_view_writes). Blocking."""
        opener = self.files_opener()
        if opener is self._opener and not self.host_view_writes:
            raise RealPathRefused(
                "write tools are refused to a container agent: its container's view is not "
                "the one they would write in (write from inside the container)")
        return opener

    def close(self) -> None:
        """The agent ended (or the daemon stops): its workers and its threads go."""
        self.write_watch.close()
        self._drop_opener()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def pool(self) -> ThreadPoolExecutor:
        """This agent's own threads for blocking work: as many as it may have
        calls in flight, so a call stuck on a stopped worker or a hung mount
        ties up the agent's threads, never the daemon's shared ones."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.limits.max_concurrent_calls,
                                            thread_name_prefix=f"broker-{self.agent_id}")
        return self._pool

    async def in_pool(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool(), functools.partial(fn, *args, **kwargs))

    # -- calls -----------------------------------------------------------

    def _record(
        self, call: Call, taint: Sensitivity, clearance: Sensitivity | None,
        rule: str, outcome: str, detail: str = "",
    ) -> None:
        self.audit(
            AuditRecord(
                agent=self.agent_id,
                user=self.user.name,
                uid=self.user.uid,
                tool=call.tool,
                target=call.target,
                taint=str(taint),
                clearance=str(clearance) if clearance is not None else "-",
                rule=rule,
                outcome=outcome,
                detail=detail,
                at=time.time(),
            )
        )

    async def decide(self, tool: str, args: Mapping[str, Any],
                     ahead: _Ahead | None = None) -> Decision:
        """Gate a call, holding it for a person when policy says ask.

        A call that dials a host is decided twice: first without its address,
        and only a call that would then go ahead is resolved (its name never
        reaches a resolver for a call the gate refuses or a person has not
        allowed yet: a host name can carry data out), then decided again with
        the address it will dial, the approvals given so far still holding.
        `ahead`: where a read_file's content read with its resolve is kept
        for the run (_touched), dropped if the call waits for a person."""
        call = await self._touched(tool, args, self._call_for(tool, args), ahead)
        d, view = await self._settle(tool, args, call, self.approvals.session, ahead)
        if d.outcome != "allow" or not self._dials(tool, call):
            return d
        call = await self._dialled(tool, args, call)
        return (await self._settle(tool, args, call, view))[0]

    def _dials(self, tool: str, call: Call) -> bool:
        return bool(call.host) and not call.address and (
            TOOLS.kind_of(tool) is ToolKind.WEB or tool in self.policy.tools)

    async def _settle(
        self, tool: str, args: Mapping[str, Any], call: Call, view: ApprovalView,
        ahead: _Ahead | None = None,
    ) -> tuple[Decision, ApprovalView]:
        """The decision, holding the call for a person as often as policy
        asks (at most a permission ask and a taint ask), and the approvals
        view it was reached with."""
        for _ in range(3):
            taint = self.ledger.taint
            policy = self.policy
            facts = self._facts(self._rule_args(tool, args)) if policy.rules else Facts()
            ruled = await self._rules(policy, call, taint, facts)
            d = decide(policy, call, taint, view, facts, ruled)
            if d.outcome != "ask":
                return d, view
            assert d.ask_kind is not None
            if ahead is not None:
                # What a person allows is read after the answer, not before.
                ahead.result = None
            self._record(call, taint, d.clearance, d.rule, "ask")
            answer = await self.approvals.ask(
                kind=d.ask_kind, tool=tool, target=call.target, taint=taint,
                clearance=d.clearance, rule=d.rule, detail=self._describe(tool, args),
                scope=call.approval_key,
            )
            if answer is Answer.DENY:
                return Decision("deny", f"{d.rule}:refused-by-person-or-timeout", d.steps,
                                call, taint, d.clearance, d.label), view
            if answer is Answer.ONCE:
                view = OnceApproval(view, d.ask_kind, tool, call.approval_key, taint)
        raise Unavailable("approval loop did not settle")  # pragma: no cover

    async def _rules(
        self, policy: CompiledPolicy, call: Call, taint: Sensitivity, facts: Facts,
    ) -> tuple[RuleResult | None] | None:
        """The rules' result for the gate, evaluated in this user's lane (in
        slices, the loop getting turns between them); None: no rule concerns
        this tool, the gate has nothing to evaluate."""
        concern = policy.rules.for_tool(call.tool) if policy.rules else ()
        if not concern:
            return None
        if self._dials(call.tool, call):
            # Not resolved yet (decide's first pass): rules about the address
            # wait for the second, which has it.
            concern = tuple(r for r in concern if not r.reads_address)
        views = rule_views(policy, call, taint, facts)
        return (await self._lane.evaluate(concern, views),)

    async def _touched(self, tool: str, args: Mapping[str, Any], call: Call,
                       ahead: _Ahead | None = None) -> Call:
        """The call with the real paths of the files it will touch
        (broker/resolve.py); its address comes later (`_dialled`). A
        read_file's file is read with that open when `ahead` is given."""
        kind = TOOLS.kind_of(tool)
        if kind in (ToolKind.READ, ToolKind.WRITE):
            opener = self.write_opener if kind is ToolKind.WRITE else self.files_opener
            for attempt in (1, 2):
                self.start()
                assert self._opener is not None
                try:
                    if ahead is not None and tool == "read_file":
                        got = await self._read_ahead(args, call, ahead)
                        if got is not None:
                            return got
                    return await self.in_pool(
                        lambda: resolve.file_call(call, opener(), self.policy.grant,
                                                  write=kind is ToolKind.WRITE,
                                                  outside=self._opener))
                except Unavailable:
                    self._drop_opener()  # its user can kill it: a new one, once
                    if attempt == 2:
                        raise
        own = self.policy.tools.get(tool)
        if own is not None and call.paths:
            self.start()
            assert self._opener is not None
            try:
                return await self.in_pool(
                    lambda: resolve.blueprint_paths(call, self.files_opener(),
                                                    self.policy.grant, outside=self._opener))
            except RealPathRefused as exc:
                raise ToolRefused(str(exc), "real-path-not-granted") from None
        return call

    async def _read_ahead(self, args: Mapping[str, Any], call: Call, ahead: _Ahead
                          ) -> Call | None:
        """resolve.file_call for a read_file, with its content read by the
        same open (one pool hop and one worker round trip less per read);
        None when the path the run would open is not the one resolved."""
        path = os.path.join(self.policy.workdir, str(args["path"]))
        if call.paths != (path,):
            return None  # normalised lexically ("a/../f"): resolve and run as before
        assert self._opener is not None
        files = FileTools(self._opener, self.policy.grant, self.limits)
        budget = self._budget()
        got = await self._read_ahead_on_loop(files, path, args.get("max_bytes"), budget)
        if got is None:

            def work() -> tuple[str, RawJSON | None]:
                files.outside = files.opener
                files.opener = self.files_opener()
                return files.read_ahead(path, args.get("max_bytes"), budget)

            got = await self.in_pool(work)
        real, result = got
        if result is not None:
            ahead.files, ahead.result, ahead.real, ahead.budget = files, result, real, budget
        return replace(call, target=real, paths=(real,))

    async def _read_ahead_on_loop(self, files: FileTools, path: str, max_bytes: Any,
                                  budget: int) -> tuple[str, RawJSON | None] | None:
        """FileTools.read_ahead with no thread in between (issue 47): the
        worker's round trip awaited on the loop, and the checks on what it
        opened made there too when its file system cannot make them wait
        (localfs.py), else in the pool. None: the pool's path is to be taken
        (the agent's view is not open yet or has ended, or its worker is
        busy with a pool thread's request)."""
        if self._pool_reads > 0:
            self._pool_reads -= 1
            return None
        opener = self._view_now()
        if opener is None:
            return None
        files.outside, files.opener = files.opener, opener
        plan = files.plan_ahead(path, max_bytes, budget)
        if plan is None:
            return path, None
        try:
            got = await files.reader(path).open_read_async(path, READ_FLAGS, plan[2], plan[3])
        except OpenFailed:
            return path, None
        if got is None:
            files.opener, files.outside = files.outside, None
            return None
        fd, content = got
        if localfs.local(fd):
            return files.take_ahead(path, fd, content, plan, budget)
        self._pool_reads = POOL_READS
        return await self.in_pool(files.take_ahead, path, fd, content, plan, budget)

    def _view_now(self) -> Opener | None:
        """files_opener without waiting: the opener if it is ready now, None
        when making or replacing it would block (files_opener does that in
        the pool)."""
        if self._fence is None:
            return self._opener
        if not self._view_lock.acquire(blocking=False):
            return None
        try:
            view = self._view
            return None if view is None or view.stale() else view
        finally:
            self._view_lock.release()

    async def _dialled(self, tool: str, args: Mapping[str, Any], call: Call) -> Call:
        """The call with the address it will dial (broker/resolve.py)."""
        if TOOLS.kind_of(tool) is not ToolKind.WEB:
            return await self.in_pool(resolve.blueprint_address, call)
        try:
            return await self.in_pool(
                resolve.web_call, call, args,
                allow_private=self.policy.settings.allow_private_addresses)
        except AddressRefused as exc:
            raise ToolRefused(str(exc), "address-refused") from None

    def _describe(self, tool: str, args: Mapping[str, Any]) -> str:
        own = self.policy.tools.get(tool)
        if own is None:
            return schema.describe(tool, args)
        argv = render(own, check_args(own, args))
        return f"blueprint tool {tool} runs in the agent's fence: {command_line(argv, 1400)}"

    def _rule_args(self, tool: str, args: Mapping[str, Any]) -> Mapping[str, Any]:
        """What rules see as call.args: a blueprint tool's with its defaults."""
        own = self.policy.tools.get(tool)
        return check_args(own, args) if own is not None else args

    def _call_for(self, tool: str, args: Mapping[str, Any]) -> Call:
        own = self.policy.tools.get(tool)
        if own is None:
            return schema.call_for(tool, args, self.policy.workdir)
        # The target is the whole command line it would run: what rules,
        # allowlist globs and the person answering an approval see.
        return resolve.blueprint_call(own, args, self.policy.workdir)

    def _facts(self, args: Mapping[str, Any]) -> Facts:
        ledger = tuple((e.tool, e.target, str(e.label)) for e in self.ledger.entries())
        agent = self.agent_facts
        if self._stage is not None:
            agent = {**agent, "stage": self._stage()}
        return Facts(args=args, agent=agent, ledger=ledger)

    async def call(self, tool: str, args: Mapping[str, Any]) -> dict[str, Any]:
        """Run one tool call; returns the JSON-able reply (ok or error)."""
        ahead = _Ahead()
        try:
            d = await self.decide(tool, args, ahead)
        except ToolRefused as exc:
            self._record(Call(tool, ""), self.ledger.taint, None, exc.rule, "deny", str(exc))
            return _error("denied", str(exc), exc.rule)
        except LimitExceeded as exc:
            self._record(Call(tool, ""), self.ledger.taint, None, "limit", "error", str(exc))
            return limit_error(exc)
        except LeviathError as exc:
            self._record(Call(tool, ""), self.ledger.taint, None, "bad-request", "error", str(exc))
            return _error("invalid", str(exc))
        except Exception as exc:  # every call ends with a record and a reply
            why = _unexpected(exc)
            self._record(Call(tool, ""), self.ledger.taint, None, "bad-request", "error", why)
            return _error("invalid", why)
        call = d.call
        if d.outcome == "deny":
            # A rule's reason, or the error of a rule that failed, goes with it.
            detail = d.steps[-1].detail if d.rule.startswith("rule:") and d.steps else ""
            self._record(call, d.taint, d.clearance, d.rule, "deny", detail)
            return _error("denied", _why(d), d.rule)
        try:
            result, label = await self._run(tool, args, d.label, call, ahead)
        except ToolRefused as exc:
            self._record(call, d.taint, d.clearance, exc.rule, "deny", str(exc))
            return _error("denied", str(exc), exc.rule)
        except LimitExceeded as exc:
            self._record(call, d.taint, d.clearance, "limit", "error", str(exc))
            return limit_error(exc)
        except LeviathError as exc:
            self._record(call, d.taint, d.clearance, d.rule, "error", str(exc))
            return _error("failed", str(exc))
        except OSError as exc:
            self._record(call, d.taint, d.clearance, d.rule, "error", str(exc))
            return _error("failed", f"{exc.filename or tool}: {exc.strerror or exc}")
        except Exception as exc:  # a record and a named error, never a dropped call
            why = _unexpected(exc)
            self._record(call, d.taint, d.clearance, d.rule, "error", why)
            return _error("failed", why)
        if not isinstance(result, RawJSON):
            result = RawJSON.of(result)
        if result.size > self._budget():
            big = too_large("reply_max_bytes", self.limits.reply_max_bytes,
                            f"the {tool} reply would be {result.size} bytes")
            self._record(call, d.taint, d.clearance, "limit", "error", str(big))
            return limit_error(big)
        self._guard_writes(label)
        entry = self.ledger.add(tool, call.target, label)
        if self.ledger.taint <= Sensitivity.INTERNAL:
            self.write_watch.release()
        self._record(call, d.taint, d.clearance, d.rule, "allow")
        return {
            "ok": True,
            "result": result,
            "label": str(label),
            "entry": entry.id,
            "taint": str(self.ledger.taint),
        }

    def _budget(self) -> int:
        return max(0, self.limits.reply_max_bytes - ENVELOPE)

    # -- the agent's own writes (broker/writewatch.py) -------------------

    def _guard_writes(self, label: Sensitivity) -> None:
        """Before a reply brings data above Internal (or while the agent
        holds some, e.g. after a daemon restart): its mounts are watched.
        Before the budget pushes the oldest entry out: its writes are
        labelled at the taint they were made under."""
        watched = self.write_watch.ensure
        if max(label, self.ledger.taint) > Sensitivity.INTERNAL and not watched(
            self.caller_pid, self.scope_cgroup
        ):
            self._watch_failed(self.write_watch.failed or "unknown")
        entries = self.ledger.entries()
        top = self.ledger.taint
        if (len(entries) >= self.ledger.budget and label < top and entries[0].label == top
                and sum(e.label == top for e in entries) == 1):
            self._settle_writes()  # the oldest, the last one at the top, is going

    def engine_changed(self) -> None:
        """The agent's engine socket is about to run or store something
        (a container started, an exec, a create, a build). Its containers'
        mounts are the engine's, built after our marks, and the engine keeps
        what it is given (a command line, a volume): while the agent holds
        data above Internal, what went there is unknown, as after lost
        events, so every later read of this agent is labelled at least
        that taint."""
        if self.ledger.taint > Sensitivity.INTERNAL:
            self.write_watch.lost(self.ledger.taint)

    def watch_fence(self, pid: int, cgroup: str) -> None:
        """The `shell` tool's fence (`pid`, its PID 1, in the agent's scope
        by the kernel's word) is built and waits: while the agent holds
        data above Internal, or its processes wrote labelled files this run
        (whose opening must raise the taint), its mounts are marked before
        the command runs. If they cannot be, the command does not run."""
        watch = self.write_watch
        if self.ledger.taint <= Sensitivity.INTERNAL and not watch.active:
            return
        if not watch.ensure_fence(pid, cgroup):
            why = watch.failed or "unknown"
            self._watch_failed(why)
            raise Unavailable(f"the shell's writes cannot be watched: {why}")

    def watch_from_start(self, pid: int, cgroup: str) -> None:
        """The agent's own fence, in a workdir where some agent's processes
        wrote data above Internal, waits before its command runs: its mounts
        are marked and stay marked for the agent's life, so its processes
        opening a file labelled in an earlier run raise the taint
        (`_read_in_sandbox`) as in the run that labelled it."""
        self.write_watch.sticky = True
        if not self.write_watch.ensure_fence(pid, cgroup):
            why = self.write_watch.failed or "unknown"
            self._watch_failed(why)
            raise Unavailable(f"the agent's opens cannot be watched: {why}")

    def _labelled(self, label: Sensitivity) -> None:
        """The watch labelled a file (or lost events) at `label`: the
        workdir keeps the mark, so the next agent there is watched from its
        start (agents/start.py, _labelled_workdir)."""
        if label <= Sensitivity.INTERNAL:
            return
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().run_in_executor(
                self.pool(), self._mark_workdir, label)

    def _mark_workdir(self, label: Sensitivity) -> None:
        self.start()
        fd = self._workdir_fd()
        if fd is None:
            return
        try:
            filelabels.raise_dir_mark(fd, label)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _settle_writes(self) -> None:
        if self.ledger.taint <= Sensitivity.INTERNAL:
            return
        try:
            self.write_watch.settle(self.scope_cgroup)
        except TooBusy:
            self.write_watch.lost(self.ledger.taint)

    def _read_in_sandbox(self, label: Sensitivity, where: str) -> None:
        """The agent's own process opened a file it had labelled: the data
        is back in its hands, so back in its ledger (and the audit)."""
        self.ledger.add("file-open", where, label)
        self._record(Call("file-open", where), label, None, "labelled-file-opened", "allow",
                     "a process of the agent opened a file labelled " + str(label))

    def _watch_failed(self, why: str) -> None:
        if why == self._watch_failure:
            return
        self._watch_failure = why
        journal.record(f"agent {self.agent_id}: files its own processes write are not "
                       f"labelled: {why}", priority=syslog.LOG_WARNING,
                       LEVIATH_AGENT=self.agent_id, LEVIATH_EVENT=Event.WRITE_WATCH_FAILED)

    def _settle_label(self, files: FileTools, predicted: Sensitivity) -> Sensitivity:
        """The label of a file call, from what was really opened: a read
        outside the workdir is Private; a file carries the label kept with it
        (policy/filelabels.py: any agent's, from before any restart) or, on a
        file system that keeps none, the one this broker remembers."""
        taint = self.ledger.taint
        for key, kept in files.writes:
            if taint > Sensitivity.INTERNAL:
                self._tainted_files[key] = max(taint, self._tainted_files.get(key, taint))
            elif kept is None or kept <= Sensitivity.INTERNAL:
                self._tainted_files.pop(key, None)  # rewritten with cleaner data
        if not files.reads:
            return predicted
        label = Sensitivity.INTERNAL
        for real, key, kept in files.reads:
            if not is_inside(real, self.policy.workdir):
                label = max(label, Sensitivity.PRIVATE)
            label = max(label, self._tainted_files.get(key, Sensitivity.PUBLIC))
            if kept is not None:
                label = max(label, kept)
        return max(label, self.write_watch.floor)

    def _workdir_fd(self) -> int | None:
        if self._opener is None:
            return None
        try:
            return self._opener.open(self.policy.workdir, os.O_RDONLY | os.O_DIRECTORY)
        except (OSError, LeviathError):
            return None

    def _workdir_mark(self) -> Sensitivity:
        self.start()
        fd = self._workdir_fd()
        if fd is None:
            return Sensitivity.PUBLIC
        try:
            return filelabels.dir_mark(fd) or Sensitivity.PUBLIC
        except OSError:
            return Sensitivity.PUBLIC
        finally:
            os.close(fd)

    async def _run(
        self, tool: str, args: Mapping[str, Any], predicted: Sensitivity, call: Call,
        ahead: _Ahead | None = None,
    ) -> tuple[Any, Sensitivity]:
        settings = self.policy.settings
        kind = TOOLS.kind_of(tool)
        if (ahead is not None and ahead.result is not None and ahead.files is not None
                and call.paths == (ahead.real,) and ahead.budget == self._budget()):
            # Read with the open the gate decided on (its real path is the
            # decided one by construction), on an allowed call only.
            return ahead.result, self._settle_label(ahead.files, predicted)
        if kind in (ToolKind.READ, ToolKind.WRITE):
            workdir = self.policy.workdir
            for attempt in (1, 2):
                self.start()
                assert self._opener is not None
                files = FileTools(self._opener, self.policy.grant, self.limits)
                files.taint = self.ledger.taint
                files.decided = frozenset(call.paths)
                try:
                    result = await self.in_pool(
                        _file_call, files, tool, args, workdir, self._budget(),
                        self.write_opener if kind is ToolKind.WRITE else self.files_opener,
                    )
                except RealPathRefused as exc:
                    raise ToolRefused(str(exc), "real-path-not-granted") from None
                except Unavailable:
                    # The opener died (its user can kill it): start a new one, once.
                    self._drop_opener()
                    if attempt == 2:
                        raise
                    continue
                return result, self._settle_label(files, predicted)
        if kind is ToolKind.WEB:
            try:
                return await self.in_pool(
                    web_tool, tool, args, allow_private=settings.allow_private_addresses,
                    max_bytes=self._budget() // 2, address=call.address or None,
                ), predicted
            except AddressRefused as exc:
                raise ToolRefused(str(exc), "address-refused") from None
        if kind is ToolKind.CREDENTIAL:
            name = str(args["name"])
            spec = settings.credentials.get(name)
            if spec is None:
                raise NotFound(f"no credential named {name!r} is configured")
            if (spec.kind == "cli" and self.placeholder_for is not None
                    and self.placeholder_for(name) is not None):
                # Issue 30: its token is injected at the egress; the real
                # program with the real token, any arguments, is what not to run.
                raise AccessDenied(f"credential {name!r} is injected at the egress: run "
                                   f"{spec.wrap or 'the program'} itself in the sandbox (its "
                                   f"{spec.token_env or 'token'} is a placeholder)")
            self.start()
            assert self._opener is not None
            out = await run_credential(
                spec, [str(a) for a in args.get("args") or []], opener=self._opener,
                uid=self.user.uid, gid=self.user.gid, groups=self.user.groups,
                home=self.user.home, agent_id=self.agent_id, runner=self._credential,
            )
            _fit_output(out, self._budget())
            return out, predicted
        if kind is ToolKind.GIT:
            name, spec = gitcreds.pick(settings.credentials, tool, str(args["url"]))
            stand_in = self.placeholder_for(name) if self.placeholder_for is not None else None
            # The proxy injects into TLS only: a plain http URL (allow_http,
            # documented as the token in clear) keeps the helper's old way.
            if stand_in is not None and gitcreds.parse_url(str(args["url"]))[0] == "https":
                return {"username": spec.username, "password": stand_in}, predicted
            self.start()
            assert self._opener is not None
            token = gitcreds.check_token(await read_secret(
                spec, opener=self._opener, uid=self.user.uid, gid=self.user.gid,
                groups=self.user.groups, home=self.user.home))
            return {"username": spec.username, "password": token}, predicted
        if kind is ToolKind.SSH:
            raise Unavailable(f"{tool} is the SSH agent's: use SSH_AUTH_SOCK")
        if kind is ToolKind.SHELL:
            if self._shell is None:
                raise Unavailable("shell is not available for this agent")
            timeout = args.get("timeout")
            out = dict(await self._shell(
                ShellRequest(self.agent_id, str(args["command"]),
                             int(timeout) if timeout is not None else None)
            ))
            _fit_output(out, self._budget())
            # The shell can read back anything written in the workdir while
            # tainted, by this agent or any other, before any restart.
            mark = await self.in_pool(self._workdir_mark)
            watch = self.write_watch
            return out, max([predicted, mark, watch.floor, watch.written,
                             *self._tainted_files.values()])
        own = self.policy.tools.get(tool)
        if own is not None:
            if self._tool_runner is None:
                raise Unavailable(f"{tool}: blueprint tools need the daemon's fence, which "
                                  "this broker lacks")
            argv = tuple(render(own, check_args(own, args)))
            out = dict(await self._tool_runner(ArgvRequest(self.agent_id, argv, own.timeout)))
            _fit_output(out, self._budget())
            # It runs where the shell runs, so it carries at least what the
            # shell would; its declaration can only raise that.
            mark = await self.in_pool(self._workdir_mark)
            watch = self.write_watch
            return out, max([predicted, own.output, Sensitivity.INTERNAL, mark, watch.floor,
                             watch.written,
                             *self._tainted_files.values()])
        raise Unavailable(f"{tool} is not implemented")  # the gate refuses unknown tools

    # -- what the agent may call -----------------------------------------

    def tool_list(self) -> dict[str, Any]:
        """The built-in tools and this agent's blueprint tools, with their
        schemas (`lev tool list`, MCP tools/list). Whether a call passes is
        the gate's business at call time; a tool denied outright is left out."""
        tools: list[dict[str, Any]] = []
        for t in self.policy.registry.values():
            if t.kind in (ToolKind.GIT, ToolKind.SSH):
                # git's credential helper's and the SSH agent's: a model is not
                # offered tokens (a direct call still meets the same gate).
                continue
            row: dict[str, Any] = {"name": t.name, "description": t.description,
                                   "inputSchema": t.input_schema(), "source": "builtin"}
            if t.kind is ToolKind.BLUEPRINT:
                row.update(source="blueprint", output=str(t.label),
                           sends_data=t.sends_out is SendsOut.ALWAYS)
            tools.append(row)
        table = self.policy.permissions
        shown = [t for t in tools if table.get(t["name"]) != "deny"]
        return {"ok": True, "tools": shown}

    # -- the agent's view of its ledger ---------------------------------

    def evict(self, ids: list[int]) -> dict[str, Any]:
        if self.ledger.taint > Sensitivity.INTERNAL:
            # What the agent's processes wrote while tainted is labelled
            # before the taint may drop.
            try:
                self.write_watch.settle(self.scope_cgroup)
            except TooBusy as exc:
                return _error("busy", f"{exc}; nothing evicted")
        dropped = self.ledger.drop(ids)
        if self.ledger.taint <= Sensitivity.INTERNAL:
            self.write_watch.release()
        return {"ok": True, "dropped": dropped, "taint": str(self.ledger.taint)}

    def ledger_view(self) -> dict[str, Any]:
        return {
            "ok": True,
            "taint": str(self.ledger.taint),
            "budget": self.ledger.budget,
            "entries": [
                {"id": e.id, "tool": e.tool, "target": e.target, "label": str(e.label)}
                for e in self.ledger.entries()
            ],
        }


@dataclass
class _Ahead:
    """A read_file's reply read with the open that found its real path,
    kept for the run of the same call (Broker._read_ahead)."""

    files: FileTools | None = None
    result: RawJSON | None = None
    real: str = ""
    budget: int = 0


def _file_call(
    files: FileTools, tool: str, args: Mapping[str, Any], workdir: str, budget: int,
    opener: Callable[[], Opener],
) -> RawJSON:
    # The host's opener it was made with: for granted reads beyond the workdir.
    files.outside = files.opener
    files.opener = opener()

    def path(p: object) -> str:
        return os.path.join(workdir, str(p))

    max_bytes = args.get("max_bytes")
    if tool == "read_file":
        return files.read_file(path(args["path"]), max_bytes, budget)
    if tool == "read_files":
        return files.read_files([path(p) for p in args["paths"]], max_bytes, budget)
    if tool == "list_dir":
        return files.list_dir(path(args.get("path") or "."), budget)
    if tool == "write_file":
        return files.write_file(path(args["path"]), str(args["content"]))
    return files.edit_file(
        path(args["path"]), str(args["old"]), str(args["new"]), bool(args.get("all", False))
    )


def _fit_output(out: dict[str, Any], budget: int) -> None:
    """Cut a shell's stdout and stderr so the reply fits, saying so."""
    for _ in range(8):
        size = len(json.dumps(out, ensure_ascii=False).encode())
        if size <= budget:
            return
        for key in ("stdout", "stderr"):
            text = out.get(key)
            if isinstance(text, str) and text:
                out[key] = text[: len(text) * budget // (2 * size)]
                out["truncated"] = True


def _unexpected(exc: Exception) -> str:
    """A bounded message for an error no tool named (a bug to fix, but the call
    still ends with its record and a reply)."""
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def limit_error(exc: LimitExceeded) -> dict[str, Any]:
    return {"ok": False, "error": {"code": "too-large", "message": str(exc),
                                   "limit": exc.limit, "max": exc.value}}


def _why(d: Decision) -> str:
    last = d.steps[-1].detail if d.steps else d.rule
    return f"{d.call.tool} refused: {last} [{d.rule}]"


def _error(code: str, message: str, rule: str | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if rule is not None:
        err["rule"] = rule
    return {"ok": False, "error": err}
