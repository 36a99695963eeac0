"""What an agent's sandbox gets for its credentials of kind git, cli and ssh.

- its spec extension (with the step's effective settings): the folder of
  helper programs (`bin` in the agent's socket folder, /run/leviath/bin in
  a namespace sandbox) first on PATH; git's configuration, through
  GIT_CONFIG_COUNT/KEY/VALUE variables (no file of the user's is written),
  making the helper git's only credential helper for the covered hosts; and
  SSH_AUTH_SOCK when an ssh credential exists (creds/sshagent.py);
- its start (after the gate's, which makes the folder): the programs,
  root's, 0755 (they hold no secret: each asks the broker).

A container agent gets none of it (its image has neither `lev`'s Python nor
the daemon's package), which its notes say; behind the proxy its git and
http credentials (and cli ones with `hosts`) are injected at the egress
instead (proxy/egress.py).
"""

from __future__ import annotations

import os
import shlex
import sys
import syslog
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from leviathd import fsat
from leviathd.agents.feature import Feature
from leviathd.agents.service import Agents
from leviathd.broker.core import Broker
from leviathd.config.merge import Effective, MergeResult
from leviathd.domain.sandbox import SandboxKind
from leviathd.gate.service import SANDBOX_RUNTIME, GateService, agent_dir
from leviathd.identity import UserInfo
from leviathd.proxy import azure, egress
from leviathd.records import AgentRecord
from leviathd.sandbox import gitenv
from leviathd.sandbox.spec import SandboxSpec
from leviathd.systemd import journal

if TYPE_CHECKING:
    from leviathd.creds.sshagent import SSHAgentServer

BIN = "bin"
GIT_HELPER = "git-credential-leviath"
SSH_SOCKET = "ssh-agent.sock"


def _of_kind(credentials: Mapping[str, Any], kind: str) -> dict[str, Any]:
    return {n: c for n, c in credentials.items() if getattr(c, "kind", "command") == kind}


def wrappers(credentials: Mapping[str, Any], inside: Iterable[str] = ()) -> dict[str, str]:
    """Program name on PATH → the cli credential it runs (the first by name
    when two wrap the same program). `inside`: cli credentials injected at
    the egress, whose real program the agent runs itself: no wrapper."""
    out: dict[str, str] = {}
    skip = set(inside)
    for name in sorted(n for n in _of_kind(credentials, "cli") if n not in skip):
        c = credentials[name]
        prog = c.wrap or str(c.command[0]).rsplit("/", 1)[-1]
        out.setdefault(prog, name)
    return out


def git_config(credentials: Mapping[str, Any], helper: str) -> dict[str, str]:
    """GIT_CONFIG_* variables of `git_pairs`, numbered from 0."""
    return gitenv.append({}, git_pairs(credentials, helper))


def git_pairs(credentials: Mapping[str, Any], helper: str) -> list[tuple[str, str]]:
    """For each covered URL, the helper list reset and then ours alone (so
    no helper of the user's answers for those hosts from inside the
    sandbox), with the path passed (the audit shows the repo)."""
    pairs: list[tuple[str, str]] = []
    for name in sorted(_of_kind(credentials, "git")):
        c = credentials[name]
        for pattern in c.hosts:
            for scheme in ("https", "http") if c.allow_http else ("https",):
                # git matches `*` as one whole label; fnmatch's ? and [..] it
                # cannot: such a pattern gets the helper for every host.
                url = "" if any(ch in pattern for ch in "?[]") else f"{scheme}://{pattern}"
                key = f"credential.{url}." if url else "credential."
                pairs += [(key + "helper", ""), (key + "helper", helper),
                          (key + "useHttpPath", "true")]
    return list(dict.fromkeys(pairs))


def helper_command(path: str) -> str:
    """git's helper setting for our script: read by /bin/sh, not executed
    itself. The agent's folder is on /run, and Debian's initramfs mounts
    /run noexec for the life of the system (a fence's bind keeps that), so
    git running the script by its path got "Permission denied" on a real
    Debian 13 machine (the VM test), where the test bed's /run allows it."""
    return f"!/bin/sh {shlex.quote(path)}"


def _script(*args: str) -> bytes:
    python = shlex.quote(sys.executable)
    words = " ".join(shlex.quote(a) for a in args)
    return f'#!/bin/sh\nexec {python} -I -m leviathd.cli.credhelper {words} "$@"\n'.encode()


def programs(credentials: Mapping[str, Any], inside: Iterable[str] = ()) -> dict[str, bytes]:
    files = {prog: _script("run", cred)
             for prog, cred in wrappers(credentials, inside).items()}
    if _of_kind(credentials, "git"):
        files[GIT_HELPER] = _script("git-credential")
    if any(n in _of_kind(credentials, "azure") for n in inside):
        # The sign-in wrapper (proxy/azure.py): only where the egress injects.
        files["az"] = azure.login_script(f"{SANDBOX_RUNTIME}/{BIN}")
    return files


class CredentialService(Feature):
    def __init__(self, agents: Agents, gate: GateService) -> None:
        self._agents = agents
        self._gate = gate
        self.ssh: dict[str, SSHAgentServer] = {}

    def extend_effective(self, spec: SandboxSpec, eff: Effective) -> SandboxSpec:
        creds = dict(eff.credentials)
        wanted = programs(creds, egress.inside(creds) if egress.applies(spec) else ())
        ssh = bool(_of_kind(creds, "ssh"))
        if not wanted and not ssh:
            return spec
        if spec.kind == SandboxKind.NONE:
            base = agent_dir(spec.execution_id)
        elif spec.kind == SandboxKind.NAMESPACE and any(
                m.target == SANDBOX_RUNTIME and m.kind == "bind" for m in spec.mounts):
            base = SANDBOX_RUNTIME
        else:
            # A container: what the proxy injects needs no program here.
            left = sorted(n for n, c in creds.items() if c.kind in ("git", "cli", "ssh")
                          and not (egress.applies(spec) and n in egress.injected(creds)))
            if not left:
                return spec
            return replace(spec, notes=(*spec.notes, f"credentials {', '.join(left)} (kind git, "
                                        f"cli or ssh) are not offered in a {spec.kind} sandbox"))
        env = dict(spec.env)
        if wanted:
            env["PATH"] = f"{base}/{BIN}:{env.get('PATH', '/usr/local/bin:/usr/bin:/bin')}"
            # After what is there (the proxy's http.proxy, core.sshCommand).
            env = gitenv.append(env, git_pairs(creds, helper_command(f"{base}/{BIN}/{GIT_HELPER}")))
        if ssh:
            env["SSH_AUTH_SOCK"] = f"{base}/{SSH_SOCKET}"
        return replace(spec, env=env)

    async def on_start(self, rec: AgentRecord, merged: MergeResult, user: UserInfo) -> None:
        creds = dict(merged.agent.credentials)
        behind = rec.sandbox == "namespace" and merged.agent.network == "proxy"
        files = programs(creds, egress.inside(creds) if behind else ())
        if files:
            write_programs(rec.id, files.items())
        if _of_kind(creds, "ssh") and rec.sandbox in (SandboxKind.NONE, SandboxKind.NAMESPACE):
            await self._open_ssh(rec.id, user.uid, user.gid)

    async def _open_ssh(self, agent_id: str, uid: int, gid: int) -> None:
        def broker_of() -> Broker | None:
            live = self._gate.live.get(agent_id)
            return live.broker if live is not None else None

        # asyncssh costs the daemon ~12 MB and a third of a second at start:
        # loaded with the first ssh credential, not by every daemon.
        from leviathd.creds.sshagent import SSHAgentServer

        server = SSHAgentServer(agent_id, os.path.join(agent_dir(agent_id), SSH_SOCKET),
                                lookup=self._gate.lookup, broker_of=broker_of)
        await server.start(uid, gid)
        self.ssh[agent_id] = server

    async def on_end(self, rec: AgentRecord) -> None:
        server = self.ssh.pop(rec.id, None)
        if server is not None:
            await server.close()

    async def recover(self) -> None:
        """After the gate's: the SSH agents of the adopted agents whose
        brokers came back, from the policy each started with."""
        for agent_id, live in list(self._gate.live.items()):
            creds = live.broker.policy.settings.credentials
            if live.rec.sandbox not in (SandboxKind.NONE, SandboxKind.NAMESPACE):
                continue
            # The gate emptied the agent's folder when it took it over: the
            # helper programs go back (without them git had no credential
            # helper after a restart). Injected cli credentials (the proxy
            # preset their placeholders) still run inside, with no wrapper.
            ph = live.broker.placeholder_for
            files = programs(creds, {n for n, c in creds.items()
                                     if c.kind == "cli" and ph is not None and ph(n)})
            if files:
                try:
                    write_programs(agent_id, files.items())
                except OSError as exc:
                    journal.record(f"agent {agent_id}: no credential helpers after the "
                                   f"restart: {exc}", priority=syslog.LOG_WARNING,
                                   LEVIATH_AGENT=agent_id)
            if agent_id in self.ssh or not any(c.kind == "ssh" for c in creds.values()):
                continue
            try:
                await self._open_ssh(agent_id, live.broker.user.uid, live.broker.user.gid)
            except OSError as exc:
                journal.record(f"agent {agent_id}: no SSH agent after the restart: {exc}",
                               priority=syslog.LOG_WARNING, LEVIATH_AGENT=agent_id)

    async def close(self) -> None:
        for server in list(self.ssh.values()):
            await server.close()
        self.ssh.clear()


def write_programs(agent_id: str, files: Iterable[tuple[str, bytes]]) -> None:
    """Into the agent's folder (root's, made by the gate), by descriptor."""
    fd = fsat.open_dir(agent_dir(agent_id))
    try:
        bfd = fsat.subdir_at(fd, BIN, 0o755)
    finally:
        os.close(fd)
    try:
        fsat.set_owner_mode(bfd, os.geteuid(), os.getegid(), 0o755)
        for name, data in files:
            fsat.atomic_write_at(bfd, name, data, mode=0o755)
    finally:
        os.close(bfd)
