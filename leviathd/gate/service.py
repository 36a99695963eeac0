"""The tool gate inside the daemon: one broker per running agent.

`GateService` is the first of the agents' features (agents/feature.py):

- its spec extension binds the agent's own socket folder
  `$LEVIATH_RUNTIME_DIR/agents/<id>/` read-only at `/run/leviath` in a
  namespace sandbox (the socket is `/run/leviath/broker.sock` there) and sets
  `LEVIATH_BROKER` (for kind none: the host path of the socket);
- its start creates the folder (root's, group the agent's user's primary
  group, 0750: see `_prepare_folder`), the
  Broker and its BrokerServer from the merged effective settings, and keeps a
  snapshot of those settings in `$LEVIATH_STATE_DIR/gate/<id>.json`;
- its end closes both and removes the folder and the snapshot.

`recover()` re-creates the brokers of agents adopted after a daemon restart
from their snapshots: an agent keeps the policy it started with, restart or
not, and its ledger (saved after every call that changed it), so a restart
does not reset its taint. Every decision goes to the journal through leviathd/audit/trail.py
(`lev audit <id>`).
The `shell` tool and a blueprint's own tools run in the agent's own scope
and sandbox (see `run_shell`, `run_tool`).
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import os
import signal
import sys
import syslog
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from leviathd import fsat
from leviathd.agents.feature import Feature
from leviathd.agents.service import Agents
from leviathd.audit import trail as audit
from leviathd.broker.core import AuditRecord, Broker
from leviathd.broker.credentials import CredentialRequest
from leviathd.broker.rulelane import Lanes
from leviathd.broker.server import BrokerServer, agent_id_from_cgroup, cgroup_of
from leviathd.broker.tools import MAX_READ, ArgvRequest, ShellRequest
from leviathd.config.merge import MergeResult
from leviathd.config.policy_settings import policy_settings
from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import AccessDenied, NotFound, Unavailable
from leviathd.events import Event
from leviathd.identity import UserInfo, user_info
from leviathd.paths import runtime_dir
from leviathd.policy.approvals import Answer, ApprovalQueue, PendingRequest
from leviathd.policy.ledger import Entry, Ledger
from leviathd.policy.settings import PolicySettings
from leviathd.readpatterns import is_inside
from leviathd.records import AgentRecord, RecordStore
from leviathd.sandbox import fencehold
from leviathd.sandbox.container import cgroup_procs_files
from leviathd.sandbox.launchers import launcher
from leviathd.sandbox.spec import Mount, SandboxSpec
from leviathd.systemd import journal

# At shutdown, between unlinking the brokers' sockets and closing them.
DRAIN_SECONDS = 0.2
SANDBOX_RUNTIME = "/run/leviath"  # where the agent's folder appears in a namespace sandbox
# The agent's trust bundle in that folder (the system's CAs and the agent's
# proxy CA; proxy/egress.py writes it): its engine trusts it too.
CA_BUNDLE = f"{SANDBOX_RUNTIME}/ca-bundle.pem"
SOCKET_NAME = "broker.sock"
SHELL_TIMEOUT = 300


def agents_dir() -> str:
    return os.path.join(runtime_dir(), "agents")


def agent_dir(agent_id: str) -> str:
    return os.path.join(agents_dir(), agent_id)


# --------------------------------------------------------------- snapshots


def _agent_facts(rec: AgentRecord, user: UserInfo, settings: PolicySettings) -> dict[str, Any]:
    """The agent as policy rules see it (docs/configuration.md, "Policy rules")."""
    groups = []
    for gid in user.groups:
        try:
            groups.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            groups.append(str(gid))
    # "stage" is filled in per call (GateService.stage_of).
    return {"id": rec.id, "blueprint": rec.agent, "stage": "", "user": rec.user,
            "uid": rec.uid, "groups": tuple(groups), "sandbox": rec.sandbox,
            "network": settings.network}


# ------------------------------------------------------------------ service


# (the agent's recorded spec, the request, the agent's folder) -> the fence
# the credential command runs in.
CredentialCommandSpec = Callable[[SandboxSpec, CredentialRequest, str], SandboxSpec]


@dataclass
class _Live:
    rec: AgentRecord
    broker: Broker
    server: BrokerServer


class GateService(Feature):
    # A namespace fence in a labelled workdir waits for the broker's marks.
    holds_fence = True

    def __init__(self, agents: Agents, *, state_dir: str,
                 credential_spec: CredentialCommandSpec | None = None) -> None:
        self._agents = agents
        # Builds a credential command's fence (creds/command.py), given by the
        # composition root: the credential service stands above the gate
        # (it uses the gate's folder and broker), so the gate does not import it.
        self._credential_spec = credential_spec
        self._store = RecordStore(state_dir)
        self._snapshots = os.path.join(state_dir, "gate")
        self.live: dict[str, _Live] = {}
        # Called with each new approval request (the bus layer emits a signal).
        self.on_approval_requested: list[Callable[[PendingRequest], None]] = []
        # One lane per user for rule evaluation (broker/rulelane.py).
        self._lanes = Lanes()
        # Called with each new broker before its socket serves a call (the
        # proxy presets the placeholders of an adopted agent: issue 30).
        self.broker_hooks: list[Callable[[str, Broker], None]] = []

    # -- what the agent sees ----------------------------------------------

    def extend_spec(self, spec: SandboxSpec) -> SandboxSpec:
        host_socket = os.path.join(agent_dir(spec.execution_id), SOCKET_NAME)
        if not launcher(spec.kind).fenced:
            return replace(spec, env={**spec.env, "LEVIATH_BROKER": host_socket})
        own = agent_dir(spec.execution_id)
        # /run/leviath is hidden from agents, and the launcher refuses to bind
        # anything inside a hidden path. The agent's own folder is the one
        # exception: the runtime folder's other entries stay hidden by name
        # (other agents' folders are 0750 root:<their user's group>, and their
        # sockets refuse any peer outside their own scope).
        runtime = {runtime_dir(), os.path.realpath(runtime_dir())}
        hidden = [h for h in spec.hidden if h not in runtime]
        broader = next((h for h in hidden if is_inside(own, h)), None)
        if broader is not None:
            # An admin hid something above the runtime folder (say /run):
            # that wins; the agent runs without its broker and is told why.
            return replace(spec, notes=(*spec.notes, f"tool broker not bound: {own} is "
                                        f"inside the hidden path {broader}"))
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(runtime_dir())):
                if name != "agents":
                    hidden.append(os.path.join(runtime_dir(), name))
            for name in sorted(os.listdir(agents_dir())):
                if name != spec.execution_id:
                    hidden.append(os.path.join(agents_dir(), name))
        mount = Mount("bind", SANDBOX_RUNTIME, own, readonly=True, why="tool broker socket")
        return replace(
            spec,
            mounts=(*spec.mounts, mount),
            hidden=tuple(dict.fromkeys(hidden)),
            env={**spec.env, "LEVIATH_BROKER": f"{SANDBOX_RUNTIME}/{SOCKET_NAME}"},
        )

    # -- life cycle ---------------------------------------------------------

    async def on_fence(self, rec: AgentRecord, pid: int) -> None:
        """An agent's own fence in a labelled workdir waits for its marks."""
        live = self.live.get(rec.id)
        if live is None:
            raise Unavailable(f"agent {rec.id} has no broker")
        live.broker.watch_from_start(pid, cgroup_of(rec.supervisor_pid))

    async def on_start(self, rec: AgentRecord, merged: MergeResult, user: UserInfo) -> None:
        settings = policy_settings(merged.agent, self._agents.machine_config)
        self._save_snapshot(rec.id, settings)
        try:
            await self._open(rec, user, settings)
        except BaseException:
            self._remove(rec.id)
            raise

    async def on_end(self, rec: AgentRecord) -> None:
        live = self.live.pop(rec.id, None)
        if live is not None:
            await live.server.close()
            live.broker.close()
        self._remove(rec.id)

    async def recover(self) -> None:
        """After `agents.recover()`: brokers for the adopted agents, from the
        settings each started with; folders of agents that are gone removed."""
        running = {r.id: r for r in self._agents.records.values() if r.running}
        for agent_id, rec in running.items():
            if agent_id in self.live:
                continue
            try:
                settings = self._load_snapshot(agent_id)
                ledger = self._load_ledger(agent_id, settings.budget)
                await self._open(rec, user_info(rec.uid), settings, ledger)
            except (OSError, ValueError, KeyError, TypeError, NotFound) as exc:
                journal.record(
                    f"agent {agent_id}: no tool broker after the restart: {exc}",
                    priority=syslog.LOG_WARNING, LEVIATH_AGENT=agent_id,
                    LEVIATH_EVENT=Event.BROKER_LOST,
                )
        with contextlib.suppress(OSError), _dir(agents_dir()) as afd:
            for name in os.listdir(afd):
                if name not in running:
                    with contextlib.suppress(OSError):
                        fsat.remove_tree_at(afd, name)
        with contextlib.suppress(OSError), _dir(self._snapshots) as sfd:
            for name in os.listdir(sfd):
                if name.split(".")[0] not in running:
                    with contextlib.suppress(OSError):
                        fsat.unlink_at(sfd, name)

    async def close(self) -> None:
        """Daemon shutdown: sockets closed, folders kept (the agents live on
        and a restarted daemon serves them again). Names first, then a
        moment to accept what the kernel queued: closing a listening socket
        resets the connections in its backlog, and those clients could not
        tell a call never seen from one cut off half-way."""
        lives = list(self.live.values())
        for live in lives:
            live.server.withdraw()
        if lives:
            await asyncio.sleep(DRAIN_SECONDS)
        # Server.close waits for the calls in flight (bounded by the caller).
        await asyncio.gather(*(live.server.close() for live in lives),
                             return_exceptions=True)
        for live in lives:
            live.broker.close()
        self.live.clear()

    async def _open(
        self, rec: AgentRecord, user: UserInfo, settings: PolicySettings,
        ledger: Ledger | None = None,
    ) -> None:
        folder = agent_dir(rec.id)
        _prepare_folder(rec.id, user)
        approvals = ApprovalQueue(
            agent_id=rec.id, owner_uid=rec.uid, timeout=settings.approval_timeout,
            on_request=self._requested, on_resolved=self._resolved,
        )
        broker = Broker(
            agent_id=rec.id, user=user, workdir=rec.workdir, settings=settings,
            ledger=ledger or Ledger(settings.budget), approvals=approvals,
            audit=lambda record: self._audit(rec.id, record), shell=self.run_shell,
            credential=self.run_credential, agent_facts=_agent_facts(rec, user, settings),
            tool_runner=self.run_tool, stage=lambda: self.stage_of(rec.id),
            lane=self._lanes.lane(rec.uid), fence=lambda: self.fence_of(rec.id),
        )
        for hook in self.broker_hooks:
            hook(rec.id, broker)
        server = BrokerServer(broker, lookup=self.lookup,
                              path=os.path.join(folder, SOCKET_NAME), mode=0o600)
        try:
            await server.start()
        except BaseException:
            broker.close()
            raise
        self.live[rec.id] = _Live(rec, broker, server)

    def _audit(self, agent_id: str, record: AuditRecord) -> None:
        live = self.live.get(agent_id)
        audit.WRITER.tool(
            record, taint_after=str(live.broker.ledger.taint) if live is not None else "-"
        )
        if live is not None and record.outcome in ("allow", "error"):
            # The ledger changed: keep it, so a daemon restart does not reset
            # the agent's taint. (Evictions the agent reports are saved with
            # the next call: until then a restart only errs on the tainted side.)
            try:
                self._save_ledger(agent_id, live.broker.ledger)
            except OSError as exc:
                journal.record(f"agent {agent_id}: ledger not saved: {exc}",
                               priority=syslog.LOG_WARNING, LEVIATH_AGENT=agent_id)

    def lookup(self, cgroup: str) -> str | None:
        """The running agent whose scope holds this cgroup path, confirmed
        against the registry (the unit must be a component of the path)."""
        agent_id = agent_id_from_cgroup(cgroup)
        if agent_id is None:
            return None
        live = self.live.get(agent_id)
        if live is None or not live.rec.running or live.rec.unit not in cgroup.split("/"):
            return None
        return agent_id

    # -- snapshots ----------------------------------------------------------

    def _snapshot_path(self, agent_id: str) -> str:
        return os.path.join(self._snapshots, f"{agent_id}.json")

    def _save_snapshot(self, agent_id: str, settings: PolicySettings) -> None:
        with _dir(self._snapshots, create_mode=0o700) as sfd:
            fsat.atomic_write_at(sfd, f"{agent_id}.json", settings.to_snapshot())

    def _save_ledger(self, agent_id: str, ledger: Ledger) -> None:
        entries = [{"id": e.id, "tool": e.tool, "target": e.target, "label": int(e.label),
                    "at": e.at} for e in ledger.entries()]
        with _dir(self._snapshots, create_mode=0o700) as sfd:
            fsat.atomic_write_at(sfd, f"{agent_id}.ledger", json.dumps(entries).encode())

    def _load_ledger(self, agent_id: str, budget: int) -> Ledger:
        try:
            with open(os.path.join(self._snapshots, f"{agent_id}.ledger"),
                      encoding="utf-8") as f:
                saved = json.load(f)
        except FileNotFoundError:
            return Ledger(budget)
        return Ledger.restore(budget, [
            Entry(int(e["id"]), str(e["tool"]), str(e["target"]), Sensitivity(int(e["label"])),
                  float(e["at"]))
            for e in saved
        ])

    def _load_snapshot(self, agent_id: str) -> PolicySettings:
        try:
            with open(self._snapshot_path(agent_id), "rb") as f:
                return PolicySettings.from_snapshot(f.read())
        except FileNotFoundError:
            raise NotFound(f"no policy snapshot for agent {agent_id}") from None

    def _remove(self, agent_id: str) -> None:
        with contextlib.suppress(OSError), _dir(agents_dir()) as afd:
            fsat.remove_tree_at(afd, agent_id)
        with contextlib.suppress(OSError), _dir(self._snapshots) as sfd:
            fsat.unlink_at(sfd, f"{agent_id}.json")
            fsat.unlink_at(sfd, f"{agent_id}.ledger")

    # -- approvals ----------------------------------------------------------

    def _requested(self, req: PendingRequest) -> None:
        for listener in self.on_approval_requested:
            listener(req)

    def _resolved(self, req: PendingRequest, answer: Answer, by: int | None) -> None:
        who = "nobody (timed out)" if by is None else f"uid {by}"
        journal.record(
            f"agent {req.agent_id}: approval {req.id} for {req.tool} {req.target}: "
            f"{answer.value} by {who}",
            LEVIATH_AGENT=req.agent_id, LEVIATH_EVENT=Event.APPROVAL, LEVIATH_REQUEST=req.id,
            LEVIATH_TOOL=req.tool, LEVIATH_TARGET=req.target, LEVIATH_ANSWER=answer.value,
            LEVIATH_BY_UID=by,
        )

    def pending(self, uid: int | None) -> list[PendingRequest]:
        """Pending requests of `uid`'s agents (everyone's for None)."""
        out: list[PendingRequest] = []
        for live in self.live.values():
            if uid is None or live.rec.uid == uid:
                out += live.broker.approvals.pending()
        return sorted(out, key=lambda r: r.created)

    def find(self, request_id: str) -> PendingRequest | None:
        for live in self.live.values():
            for req in live.broker.approvals.pending():
                if req.id == request_id:
                    return req
        return None

    def answer(self, request_id: str, answer: Answer, by_uid: int, *, admin: bool) -> None:
        """`admin`: the caller holds org.leviath.approval.answer-any (asked
        by gate/answers.py through the call's Authority)."""
        req = self.find(request_id)
        if req is None:
            raise NotFound(f"no pending approval {request_id!r}")
        self.live[req.agent_id].broker.approvals.answer(request_id, answer, by_uid, admin=admin)

    # -- the shell tool -------------------------------------------------------

    def stage_of(self, agent_id: str) -> str:
        """The name of the [stages.NAME] the agent runs now, as its supervisor
        (root, in the scope) last wrote it; "" in a seed command, for an
        agent without stages, or before the first step."""
        step = self._store.read_step(agent_id)
        if step is None or not step[1].startswith("stage "):
            return ""
        return step[1].removeprefix("stage ")

    def _agent_spec(self, agent_id: str) -> tuple[_Live, SandboxSpec]:
        """The recorded spec of the step that runs now (its fence: each stage
        may have its own), else of the last step."""
        live = self.live.get(agent_id)
        if live is None or not live.rec.running:
            raise Unavailable(f"agent {agent_id} is not running")
        steps = self._store.load_spec(agent_id)
        if not steps:
            raise Unavailable(f"agent {agent_id} has no recorded sandbox spec")
        if len(steps) == 1:
            return live, _recorded(agent_id, steps[0]["spec"])
        # Stages may each have their own fence (a plan stage without network):
        # when the step running now is not known (its record could not be
        # written, e.g. a full state disk), no fence is guessed, since the
        # last one may be looser than the one the agent is in.
        step = self._store.read_step(agent_id)
        here = steps[step[0]] if step is not None and 0 <= step[0] < len(steps) else None
        if here is None or step is None or here.get("label") != step[1]:
            raise Unavailable(f"agent {agent_id}: the step it runs now is not recorded, so "
                              "the fence to run this in is not known")
        return live, _recorded(agent_id, here["spec"])

    def fence_of(self, agent_id: str) -> int | None:
        """A pidfd on PID 1 of the agent's running fence, for the file tools'
        worker to enter its mounts (broker/opener.py); None for a sandbox
        without a fence to join (kind none: the host's view is the agent's).
        Found as the shell tool finds it (sandbox/join.py), from the anchor
        process the daemon recorded. Blocking: the broker's pool calls it."""
        live, spec = self._agent_spec(agent_id)
        if launcher(spec.kind).join is None:
            return None
        from leviathd.sandbox import join

        now = self._agents.records.get(live.rec.id, live.rec)
        return join.find_pid1(now.supervisor_pid, now.unit)

    async def run_shell(self, req: ShellRequest) -> Mapping[str, Any]:
        """Run the command in the agent's own scope and sandbox: a child of
        the daemon is moved into the scope (its cgroups), then enters the
        agent's running fence (its mounts, scratch and layers, its user, its
        network) and runs `sh -c COMMAND` there."""
        live, spec = self._agent_spec(req.agent_id)
        if not launcher(spec.kind).tools:
            raise Unavailable(f"shell is not available in a {spec.kind} sandbox yet")
        spec = replace(spec, argv=("/bin/sh", "-c", req.command))
        timeout = min(req.timeout or SHELL_TIMEOUT, SHELL_TIMEOUT)
        # In the agent's own fence (sandbox/join.py); the command waits until
        # the broker has marked that namespace's mounts for its write watch.
        hold = live.broker.watch_fence if launcher(spec.kind).held.fence_hold else None
        return await self._run_in_scope(live, spec, timeout, hold=hold, join=True)

    async def run_tool(self, req: ArgvRequest) -> Mapping[str, Any]:
        """A blueprint tool's argv, run exactly as the shell is (its scope,
        its recorded fence, its user): the blueprint chose the command, never
        where or as whom it runs."""
        live, spec = self._agent_spec(req.agent_id)
        if not launcher(spec.kind).tools:
            raise Unavailable(f"blueprint tools are not available in a {spec.kind} "
                              "sandbox yet")
        spec = replace(spec, argv=tuple(req.argv))
        # In the agent's fence too, marked first (run_shell).
        hold = live.broker.watch_fence if launcher(spec.kind).held.fence_hold else None
        return await self._run_in_scope(live, spec, min(req.timeout, SHELL_TIMEOUT),
                                        hold=hold, join=True)

    async def run_credential(self, req: CredentialRequest) -> Mapping[str, Any]:
        """A credential command in the agent's scope (its limits apply) but in
        a fence of its own, built by the credential service
        (creds/command.py); the scope runner is the `shell` tool's."""
        if self._credential_spec is None:
            raise Unavailable("credential commands are not served by this daemon")
        live, agent_spec = self._agent_spec(req.agent_id)
        spec = self._credential_spec(agent_spec, req, agent_dir(req.agent_id))
        return await self._run_in_scope(live, spec, req.timeout, stdin=req.stdin)

    async def _run_in_scope(
        self, live: _Live, spec: SandboxSpec, timeout: float, *, stdin: str = "",
        hold: Callable[[int, str], None] | None = None, join: bool = False,
    ) -> Mapping[str, Any]:
        """`join`: in the agent's running fence (found from its recorded
        anchor process, sandbox/join.py), not a fresh one of its own."""
        held = fencehold.pair() if hold is not None else None
        # The child's end keeps its number across the exec (pass_fds).
        child_end = held[1].fileno() if held else -1
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "leviathd.gate.shell",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True,
                pass_fds=(child_end,) if held else (),
            )
        except BaseException:
            if held:
                held[0].close()
            raise
        finally:
            if held:
                held[1].close()
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        message: dict[str, Any] = {"unit": live.rec.unit, "spec": spec.to_dict()}
        if join and launcher(spec.kind).join is not None:
            # The record as it is now: a handover replaced the held process
            # by PID 1 (agents/service.py).
            now = self._agents.records.get(live.rec.id, live.rec)
            message["join"] = now.supervisor_pid
        if stdin:
            message["stdin"] = stdin
        try:
            cgroup = await self._attach(live.rec, proc.pid)
            if held:
                message["hold"] = child_end
            proc.stdin.write(json.dumps(message).encode())
            await proc.stdin.drain()
            proc.stdin.close()
            out, err, _ = await asyncio.wait_for(
                asyncio.gather(
                    _read_capped(proc.stdout), _read_capped(proc.stderr),
                    fencehold.release(held[0], lambda pid: hold(pid, cgroup))
                    if held and hold is not None else asyncio.sleep(0),
                ),
                timeout,
            )
            status = await proc.wait()
        except TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            return {"exit_status": 124, "stdout": "", "stderr": f"timed out after {timeout:.0f}s",
                    "timed_out": True}
        except BaseException:
            _kill_group(proc.pid)
            await proc.wait()
            raise
        finally:
            if held:
                held[0].close()
        return {"exit_status": 128 - status if status < 0 else status,
                "stdout": out.decode("utf-8", "replace"),
                "stderr": err.decode("utf-8", "replace")}

    async def _attach(self, rec: AgentRecord, pid: int) -> str:
        """Move `pid` into the agent's scope in every cgroup hierarchy, as the
        container launcher does for its engine. systemd's own
        AttachProcessesToUnit refuses units without Delegate=yes, which agent
        scopes deliberately are not; the cgroup is read from the agent's
        supervisor, which lives in the scope for the agent's whole life."""
        try:
            cgroup = cgroup_of(rec.supervisor_pid)
            if rec.unit not in cgroup.split("/"):
                raise Unavailable(f"agent {rec.id}'s supervisor is not in {rec.unit}")
            with open("/proc/self/mountinfo", encoding="utf-8") as f:
                files = [p for p in cgroup_procs_files(cgroup, f.read()) if os.path.exists(p)]
            if not files:
                raise Unavailable(f"the control group {cgroup} is not mounted here")
            for path in files:
                with open(path, "w", encoding="ascii") as f:
                    f.write(str(pid))
        except OSError as exc:
            raise Unavailable(f"cannot move the shell into {rec.unit}: {exc}") from None
        return cgroup


def _recorded(agent_id: str, data: object) -> SandboxSpec:
    """A recorded step's spec, read back as the spec it was (the records are
    root's; a damaged one refuses the call rather than failing in the child)."""
    try:
        return SandboxSpec.from_dict(data)  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as exc:
        raise Unavailable(f"agent {agent_id}'s recorded sandbox spec cannot be read: "
                          f"{exc!r}"[:400]) from None


@contextlib.contextmanager
def _dir(path: str, *, create_mode: int | None = None) -> Iterator[int]:
    fd = fsat.open_dir(path, create_mode=create_mode)
    try:
        yield fd
    finally:
        os.close(fd)


def _prepare_folder(agent_id: str, user: UserInfo) -> None:
    """The agent's socket folder, root:<user's primary group> 0750.

    Root binds, chowns and removes the socket in it, so no one but root may
    write there: a folder the user could write lets the user swap the fresh
    socket for a symlink to a root file between bind and chown (issue 9). The
    user's group only needs to search it: the launcher opens it as the user to
    bind it into the sandbox, and a `kind = "none"` agent connects by the host
    path. The socket inside is the user's own, 0600, which is what keeps every
    other user (and group member) out. The runtime folders above are root's
    0755, re-checked each time, because everything below relies on them.

    A folder left from an older daemon (or one the user somehow made) is taken
    over in place through its descriptor, not replaced: an agent that survived
    the restart has it bound into its sandbox. Once it is root's, whatever was
    planted inside is removed by descriptor."""
    with _dir(runtime_dir(), create_mode=0o755) as rfd:
        _own_root(rfd, runtime_dir(), 0o755)
        afd = fsat.subdir_at(rfd, "agents", 0o755)
    try:
        _own_root(afd, agents_dir(), 0o755)
        fsat.empty_subdir_at(afd, agent_id, create_mode=0o700, uid=os.geteuid(),
                             gid=user.gid, mode=0o750)
    finally:
        os.close(afd)


def _own_root(fd: int, path: str, mode: int) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise AccessDenied(f"{path} is not owned by the daemon's user")
    os.fchmod(fd, mode)


async def _read_capped(stream: asyncio.StreamReader, cap: int = MAX_READ) -> bytes:
    """Up to `cap` bytes; the rest is read and dropped so the command never
    blocks on a full pipe."""
    data = bytearray()
    while chunk := await stream.read(65536):
        if len(data) < cap:
            data += chunk[: cap - len(data)]
    return bytes(data)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
