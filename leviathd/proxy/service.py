"""`network = "proxy"` in the agent life cycle.

- Its spec extension sets the proxy variables (HTTP_PROXY, HTTPS_PROXY,
  ALL_PROXY, NO_PROXY and their lowercase forms; git's http.proxy through
  GIT_CONFIG_*) in a proxied step's environment. The launcher starts the
  forwarder (leviathd/sandbox/forwarder.py) for such a step.
- Its start, after the gate's (the proxy reads the gate's live ledger and
  approval queue for the agent), opens `proxy.sock` in the agent's runtime
  folder when any step of the agent is proxied, and keeps its settings in
  `$LEVIATH_STATE_DIR/proxy/<id>.json`, so `recover()` serves an adopted
  agent with the policy it started with after a daemon restart.
- Its end closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import syslog
from dataclasses import replace

from leviathd import fsat
from leviathd.agents.feature import Feature
from leviathd.agents.service import Agents
from leviathd.audit import trail as audit
from leviathd.broker.core import AuditRecord, Broker
from leviathd.config.merge import Effective, MergeResult
from leviathd.domain.sandbox import SandboxKind
from leviathd.domain.sensitivity import Sensitivity
from leviathd.events import Event
from leviathd.gate.service import GateService, agent_dir
from leviathd.identity import UserInfo, user_info
from leviathd.policy.approvals import ApprovalQueue
from leviathd.policy.labels import clearance_for
from leviathd.proxy import azure, egress, inject, logins, policy, refresh, registries, tls
from leviathd.proxy.server import Agent, Injector, ProxyServer
from leviathd.records import AgentRecord
from leviathd.sandbox import forwarder
from leviathd.sandbox.spec import SandboxSpec
from leviathd.systemd import journal

MAX_SNAPSHOT = 1 << 20
URL = forwarder.URL
proxy_env = forwarder.proxy_env


# git over ssh: ssh has no proxy variable; `lev connect` is its way out.
SSH_COMMAND = "ssh -o ProxyCommand='lev connect %h %p'"


def _git_env(env: dict[str, str]) -> dict[str, str]:
    """http.proxy and core.sshCommand for git, after any GIT_CONFIG_* the
    environment has."""
    try:
        n = int(env.get("GIT_CONFIG_COUNT", "0"))
    except ValueError:
        n = 0
    return {**env, "GIT_CONFIG_COUNT": str(n + 2),
            f"GIT_CONFIG_KEY_{n}": "http.proxy", f"GIT_CONFIG_VALUE_{n}": URL,
            f"GIT_CONFIG_KEY_{n + 1}": "core.sshCommand",
            f"GIT_CONFIG_VALUE_{n + 1}": SSH_COMMAND}


def _proxied(merged: MergeResult) -> bool:
    return any(e.network == "proxy" for e in (merged.agent, *merged.stages.values()))


def _direct(rec: AgentRecord, merged: MergeResult) -> bool:
    """network = true in a namespace sandbox, or kind none (whatever its
    network setting), with a git credential: git's per-URL proxy to the
    daemon's loopback port (egress.applies_direct)."""
    kinds = rec.sandbox.split("+")
    return ((SandboxKind.NONE in kinds or (
                "namespace" in kinds
                and any(e.network is True for e in (merged.agent, *merged.stages.values()))))
            and bool(egress.git_only(dict(merged.agent.credentials))))


def registry_logins(sandbox: str, merged: MergeResult) -> bool:
    """Whether the user's registry logins are put in at this agent's egress
    (proxy/registries.py): only for an agent whose own engine (the user's
    rootless podman, never a root engine) pulls through this proxy."""
    eff = merged.agent
    return (sandbox in egress.FENCED and _proxied(merged) and eff.containers.enabled
            and not eff.containers.host_root)


class ProxyService(Feature):
    def __init__(self, agents: Agents, gate: GateService, *, state_dir: str) -> None:
        self._agents = agents
        self._gate = gate
        self._snapshots = os.path.join(state_dir, "proxy")
        self.live: dict[str, ProxyServer] = {}
        # Per agent: the key its placeholders derive from (issue 30).
        self._keys: dict[str, bytes] = {}
        # Per agent: the CLI logins its specs were given (issue 45), and once
        # started the real values of their placeholders (memory only).
        self._login_plans: dict[str, logins.Plan] = {}
        self._login_secrets: dict[str, dict[str, str]] = {}
        # An adopted agent's broker gets its placeholders before it serves.
        gate.broker_hooks.append(self.preset)

    def preset(self, agent_id: str, broker: Broker) -> None:
        """An adopted agent's broker (after a daemon restart) gives git the
        placeholders from its first call: they are read here from the saved
        state, before its socket serves, not when the proxy comes back later
        (meanwhile `git credential fill` got the token), nor never when the
        proxy cannot come back. A new agent has no saved state yet; its
        proxy sets them before the agent runs (_injector)."""
        try:
            fd = fsat.open_dir(self._snapshots)
        except OSError:
            return
        try:
            data = fsat.read_at(fd, f"{agent_id}.json", MAX_SNAPSHOT)
        except OSError:
            return
        finally:
            os.close(fd)
        try:
            state = json.loads(data).get("egress") or {}
            by_name = {str(d["name"]): str(d["placeholder"])
                       for d in state.get("injections") or []
                       if isinstance(d, dict) and d.get("kind") in ("git", "cli")}
        except (ValueError, AttributeError, KeyError, TypeError):
            by_name = {}
        if by_name:
            broker.placeholder_for = by_name.get

    def on_handover(self, rec: AgentRecord) -> None:
        """The agent's PID 1 runs with no relay beside it (namespace.start):
        take its listening socket and accept there."""
        server = self.live.get(rec.id)
        if server is not None:
            listener = forwarder.take_listener(rec.supervisor_pid)
            if listener is not None:
                server.adopt(listener)

    def extend_spec(self, spec: SandboxSpec) -> SandboxSpec:
        if not spec.proxy:
            return spec
        if spec.kind == SandboxKind.NONE:
            return replace(spec, proxy=False, notes=(
                *spec.notes, 'network = "proxy" has no effect unsandboxed: the agent has '
                "the host's network"))
        # namespace: the launcher starts the forwarder in its new network
        # namespace; container: the daemon, in the engine's (sandbox/container/start.py).
        return replace(spec, env=_git_env({**spec.env, **proxy_env()}))

    def _key(self, agent_id: str) -> bytes:
        key = self._keys.get(agent_id)
        if key is None:
            key = self._keys[agent_id] = secrets.token_bytes(32)
        return key

    def extend_effective(self, spec: SandboxSpec, eff: Effective) -> SandboxSpec:
        """The credentials injected at the egress (after the gate's, in the
        features' order), and the CLIs' logins as placeholders."""
        # Every namespace step but one with the host's network (the user's
        # choice: nothing would swap a placeholder there) shows placeholders:
        # a step with no network at all too, or a blueprint's `network =
        # false` stage would read the real login for a later proxied one.
        if (eff.proxy.cli_logins and spec.kind == SandboxKind.NAMESPACE
                and not spec.network):
            plan = self._login_plans.setdefault(spec.execution_id, logins.Plan())
            spec = logins.plan(spec, plan)
            if (plan.files or plan.env) and egress.applies(spec):
                spec = egress.extend_trust(spec)
        elif eff.proxy.cli_logins and spec.kind == SandboxKind.CONTAINER:
            spec = logins.withhold(spec)
        if not egress.injected(dict(eff.credentials)):
            return spec
        if not egress.applies(spec):
            return egress.extend_env(spec, eff, b"")  # the notes only
        return egress.extend_env(spec, eff, self._key(spec.execution_id))

    async def on_start(self, rec: AgentRecord, merged: MergeResult, user: UserInfo) -> None:
        direct = _direct(rec, merged)
        # The placeholder files first: the fence binds them in every step
        # that was planned with them, proxied or not.
        plan = self._login_plans.pop(rec.id, None)
        started: logins.Started | None = None
        if plan is not None and (plan.files or plan.env):
            started = await asyncio.to_thread(logins.start, plan, rec.id, user.uid, user.gid,
                                              user.home)
            for note in started.notes:
                journal.record(f"agent {rec.id}: CLI logins: {note}",
                               priority=syslog.LOG_WARNING, LEVIATH_AGENT=rec.id)
        if not _proxied(merged) and not direct:
            return
        eff = merged.agent
        taint = eff.taint
        settings = policy.from_effective(
            eff, taint_enabled=taint.enabled, on_exceed=str(taint.on_exceed.value),
            shell_clearance=clearance_for("shell", taint.clearance, network=True),
            allow_private=taint.allow_private_addresses,
        )
        injections: tuple[inject.Injection, ...] = ()
        if rec.sandbox in egress.FENCED and _proxied(merged) and egress.injected(
                dict(eff.credentials)):
            injections = egress.injections(dict(eff.credentials), self._key(rec.id))
        elif direct:
            injections = egress.injections(egress.git_only(dict(eff.credentials)),
                                           self._key(rec.id))
        if registry_logins(rec.sandbox, merged):
            # The agent's own engine pulls through this proxy: the user's
            # registry logins are put in there, toward each registry alone.
            found = await asyncio.to_thread(registries.read_logins, user.uid, user.gid,
                                            user.home)
            injections = (*injections, *registries.injections(found, self._key(rec.id)))
            for note in found.notes:
                journal.record(f"agent {rec.id}: registry logins: {note}",
                               priority=syslog.LOG_WARNING, LEVIATH_AGENT=rec.id)
        if started is not None and _proxied(merged):
            injections = (*injections, *started.injections)
            self._login_secrets[rec.id] = started.secrets
            if not injections:
                # The specs name the bundle: the system's CAs at least.
                await asyncio.to_thread(egress.write_bundle, rec.id, b"")
        push = eff.permissions.get("git_push")
        egress_state: dict[str, object] = {"key": self._key(rec.id).hex(),
                        "injections": [i.to_json() for i in injections],
                        "push": push.value if push is not None else "ask",
                        "direct": direct, "socket": _proxied(merged)}
        self._save(rec.id, settings, egress_state)
        await self._open(rec, user, settings, egress_state)

    async def on_end(self, rec: AgentRecord) -> None:
        server = self.live.pop(rec.id, None)
        self._keys.pop(rec.id, None)
        self._login_plans.pop(rec.id, None)
        self._login_secrets.pop(rec.id, None)
        if server is not None:
            await server.close()
        with contextlib.suppress(OSError):
            fd = fsat.open_dir(self._snapshots)
            try:
                fsat.unlink_at(fd, f"{rec.id}.json")
            finally:
                os.close(fd)

    async def recover(self) -> None:
        """After gate.recover(): proxies for adopted agents that had one."""
        running = {r.id: r for r in self._agents.records.values() if r.running}
        with contextlib.suppress(OSError):
            names = os.listdir(self._snapshots)
            for name in names:
                agent_id = name.split(".")[0]
                rec = running.get(agent_id)
                if rec is None or agent_id in self.live:
                    continue
                try:
                    with open(os.path.join(self._snapshots, name), encoding="utf-8") as f:
                        saved = json.load(f)
                    settings = policy.ProxySettings.from_json(saved)
                    state = saved.get("egress")
                    await self._open(rec, user_info(rec.uid), settings,
                                     state if isinstance(state, dict) else None)
                    self.on_handover(rec)
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    journal.record(f"agent {agent_id}: no network proxy after the restart: "
                                   f"{exc}", priority=syslog.LOG_WARNING,
                                   LEVIATH_AGENT=agent_id, LEVIATH_EVENT=Event.PROXY_LOST)
            fd = fsat.open_dir(self._snapshots)
            try:
                for name in names:
                    if name.split(".")[0] not in running:
                        with contextlib.suppress(OSError):
                            fsat.unlink_at(fd, name)
            finally:
                os.close(fd)

    async def close(self) -> None:
        for server in list(self.live.values()):
            await server.close()
        self.live.clear()

    async def _open(self, rec: AgentRecord, user: UserInfo, settings: policy.ProxySettings,
                    egress_state: dict[str, object] | None = None) -> None:
        gate = self._gate

        def taint() -> Sensitivity:
            live = gate.live.get(rec.id)
            # No broker (it failed to come back after a restart): assume the worst.
            if live is None:
                return Sensitivity.PRIVATE
            # Opens of labelled files the agent's processes made before this
            # connection are in the ledger before it is read.
            live.broker.write_watch.drain()
            return live.broker.ledger.taint

        def approvals() -> ApprovalQueue | None:
            live = gate.live.get(rec.id)
            return live.broker.approvals if live is not None else None

        agent = Agent(id=rec.id, user=user.name, uid=user.uid, gid=user.gid, taint=taint,
                      approvals=approvals, is_own=lambda cg: gate.lookup(cg) == rec.id)
        injector = await self._injector(rec, user, settings, egress_state)
        server = ProxyServer(agent, settings,
                             os.path.join(agent_dir(rec.id), forwarder.SOCKET_NAME),
                             self._audit, injector)
        state = egress_state or {}
        if state.get("socket", True) is not False:
            await server.start()
        self.live[rec.id] = server
        if state.get("direct") is True and injector is not None:
            # network = true: the loopback port, then the file git includes
            # naming it (a new port after a daemon restart: the file is ours
            # to rewrite, the agent's environment is not).
            port = server.listen_host()
            data = egress.gitconfig(
                (h for i in injector.injections if i.kind == "git" for h in i.hosts), port)
            await asyncio.to_thread(egress.write_gitconfig, rec.id, data)

    async def _injector(self, rec: AgentRecord, user: UserInfo, settings: policy.ProxySettings,
                        state: dict[str, object] | None) -> Injector | None:
        """The agent's CA (new at each daemon start: its key is only ever in
        memory), its bundle written, and the broker told to give git the
        placeholders."""
        agent_id = rec.id
        raw = state.get("injections") if state is not None else None
        if state is None or not isinstance(raw, list) or not raw:
            return None
        key = bytes.fromhex(str(state.get("key", "")))
        self._keys[agent_id] = key
        injections = tuple(inject.Injection.from_json(d) for d in raw if isinstance(d, dict))
        hosts = [h for i in injections for h in i.hosts]
        from leviathd.proxy.ca import AgentCA  # cryptography: only when needed

        ca = await asyncio.to_thread(AgentCA, agent_id, hosts)
        # The system's bundle is some hundred KiB: read and written off the loop.
        await asyncio.to_thread(egress.write_bundle, agent_id, ca.pem)
        gate = self._gate
        # git: its tools give the placeholder; cli: the credential tool is
        # refused (the program runs in the agent's fence with the placeholder).
        by_name = {i.name: i.placeholder for i in injections if i.kind in ("git", "cli")}
        live = gate.live.get(agent_id)
        if live is not None:
            live.broker.placeholder_for = by_name.get

        async def secret(name: str) -> str:
            if name.startswith(registries.PREFIX):
                # A registry login: read again from the user's files, as the user.
                return await asyncio.to_thread(registries.read_secret, name, user.uid,
                                               user.gid, user.home)
            if name.startswith(logins.PREFIX):
                # A CLI login's: read again from the host's file, as the user.
                return await asyncio.to_thread(
                    logins.read_secret, name, self._login_secrets.get(agent_id, {}),
                    user.uid, user.gid, user.home)
            live = gate.live.get(agent_id)
            if live is None:
                raise LookupError("the agent's broker is gone")
            return await live.broker.credential_secret(name)

        push = str(state.get("push", "ask"))
        # The system's CAs, loaded once per agent (not per connection, on the loop).
        upstream = await asyncio.to_thread(tls.client_context)
        # kind "azure": the daemon answers the agent's sign-in and fetches the
        # tokens the proxy puts in (proxy/azure.py).
        connect = azure.checked_connect(settings, uid=rec.uid, agent=agent_id)
        az = azure.AzureEgress.of(
            injections, principal=lambda name: self._principal(agent_id, name), secret=secret,
            connect=connect, upstream=upstream)
        # A CLI login's refresh: answered by the daemon, which refreshes with
        # the real token and writes the host's file as the user (proxy/refresh.py).
        cli = refresh.CliRefresh.of(injections, uid=user.uid, gid=user.gid, home=user.home,
                                    connect=connect, upstream=upstream, agent_id=agent_id)
        return Injector(ca=ca, injections=injections,
                        secret=az.wrap(secret) if az is not None else secret,
                        push=push if push in ("allow", "ask", "deny") else "ask",
                        upstream=upstream,
                        local=refresh.chain(cli.answer if cli is not None else None,
                                            az.answer if az is not None else None))

    def _principal(self, agent_id: str, name: str) -> azure.Principal:
        """The service principal as the agent's policy has it now."""
        live = self._gate.live.get(agent_id)
        spec = live.broker.policy.settings.credentials.get(name) if live is not None else None
        if spec is None or spec.kind != "azure":
            raise LookupError(f"no azure credential named {name!r} for this agent")
        return azure.Principal(tenant=spec.tenant, client_id=spec.client_id,
                               authority=spec.authority, scope=spec.scope)

    def _audit(self, record: AuditRecord) -> None:
        live = self._gate.live.get(record.agent)
        audit.WRITER.tool(record, taint_after=str(live.broker.ledger.taint)
                          if live is not None else "-")

    def _save(self, agent_id: str, settings: policy.ProxySettings,
              egress_state: dict[str, object]) -> None:
        fd = fsat.open_dir(self._snapshots, create_mode=0o700)
        try:
            data = {**settings.to_json(), "egress": egress_state}
            fsat.atomic_write_at(fd, f"{agent_id}.json", json.dumps(data).encode(),
                                 mode=0o600)
        finally:
            os.close(fd)
