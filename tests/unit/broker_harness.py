"""A real broker on a real unix socket, served from an event loop in a
background thread, for the broker tests (not a fake: the same Broker and
BrokerServer the daemon runs)."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from leviathd.broker.core import AuditRecord, Broker
from leviathd.broker.credentials import CredentialRequest, CredentialRunner
from leviathd.broker.server import BrokerServer, cgroup_of
from leviathd.broker.tools import ShellRunner
from leviathd.identity import UserInfo
from leviathd.policy.approvals import ApprovalQueue, PendingRequest
from leviathd.policy.ledger import Ledger
from leviathd.policy.settings import PolicySettings

AGENT = "abcd1234"
T = TypeVar("T")


def me(home: str) -> UserInfo:
    return UserInfo(name="tester", uid=os.getuid(), gid=os.getgid(),
                    groups=tuple(os.getgroups()), home=home)


@dataclass
class Running:
    broker: Broker
    server: BrokerServer
    loop: asyncio.AbstractEventLoop
    audit: list[AuditRecord] = field(default_factory=list)
    asked: list[PendingRequest] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.server.path

    def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the broker's loop thread (approvals live there)."""
        fut: Future[T] = Future()

        def call() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

        self.loop.call_soon_threadsafe(call)
        return fut.result(5)


@contextmanager
def running_broker(
    *,
    home: str,
    workdir: str,
    settings: PolicySettings,
    socket_path: str,
    lookup: Callable[[str], str | None] | None = None,
    user: UserInfo | None = None,
    mode: int = 0o600,
    shell: ShellRunner | None = None,
    credential: CredentialRunner | None = None,
    budget: int | None = None,
    agent_facts: dict[str, Any] | None = None,
) -> Iterator[Running]:
    own_cgroup = cgroup_of(os.getpid())
    if lookup is None:
        def lookup(path: str) -> str | None:
            return AGENT if path == own_cgroup else None

    audit: list[AuditRecord] = []
    asked: list[PendingRequest] = []
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    thread = threading.Thread(target=lambda: (asyncio.set_event_loop(loop), ready.set(),
                                              loop.run_forever()), daemon=True)
    thread.start()
    ready.wait()
    u = user or me(home)
    approvals = ApprovalQueue(agent_id=AGENT, owner_uid=u.uid, timeout=settings.approval_timeout,
                              on_request=asked.append)
    broker = Broker(agent_id=AGENT, user=u, workdir=workdir, settings=settings,
                    ledger=Ledger(budget or settings.budget), approvals=approvals,
                    audit=audit.append, shell=shell, credential=credential,
                    agent_facts=agent_facts)
    server = BrokerServer(broker, lookup=lookup, path=socket_path, mode=mode)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    running = Running(broker, server, loop, audit, asked)
    try:
        yield running
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
        broker.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


async def direct_credential(req: CredentialRequest) -> dict[str, Any]:
    """A stand-in for the daemon's fenced runner (gate_service.run_credential,
    tested in the bed): the command as is, in an empty folder, with the
    request's environment and the secret on stdin."""
    with tempfile.TemporaryDirectory() as cwd:
        proc = await asyncio.create_subprocess_exec(
            *req.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**req.env, "HOME": cwd}, cwd=cwd)
        out, err = await proc.communicate(req.stdin.encode())
    return {"exit_status": proc.returncode, "stdout": out.decode(), "stderr": err.decode()}


def call(path: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    from leviathd.cli.tool import BrokerClient

    client = BrokerClient(path)
    try:
        return client.call(tool, args)
    finally:
        client.close()
