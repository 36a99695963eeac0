"""`lev approvals` and `lev approve ID --once|--session|--deny`: the tool calls
held for a person (org.leviath.Policy1 on the daemon)."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
from typing import Any

from dbus_fast import Message

from leviathd.bus.names import POLICY_IFACE
from leviathd.cli.client import Client, DaemonError
from leviathd.cli.text import field


async def policy_call(
    client: Client, member: str, signature: str = "", body: list[Any] | None = None
) -> list[Any]:
    """A call on org.leviath.Policy1."""
    return await client.call(member, signature, body, interface=POLICY_IFACE)



def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ls = sub.add_parser("approvals", help="tool calls of your agents waiting for an answer")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=run_list)

    ap = sub.add_parser("approve", help="answer a held tool call")
    ap.add_argument("request_id", metavar="ID", help="the held call's id, from lev approvals")
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--once", dest="answer", action="store_const", const="once",
                       help="let this call run")
    which.add_argument("--session", dest="answer", action="store_const", const="session",
                       help="let it run, and like calls for the agent's life")
    which.add_argument("--deny", dest="answer", action="store_const", const="deny",
                       help="refuse the call")
    ap.set_defaults(func=run_approve)


async def _list() -> list[dict[str, Any]]:
    client = await Client.connect()
    try:
        (rows,) = await policy_call(client, "ListApprovals")
    finally:
        client.close()
    return [{k: v.value for k, v in row.items()} for row in rows]


def run_list(args: argparse.Namespace) -> int:
    rows = asyncio.run(_list())
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no calls waiting")
        return 0
    print(f"{'ID':<16} {'AGENT':<8} {'USER':<10} {'KIND':<10} {'TOOL':<11} {'TAINT':<8} "
          f"{'SINCE':<8} TARGET")
    for row in rows:
        since = datetime.datetime.fromtimestamp(row["created"]).strftime("%H:%M:%S")
        # Tool, target and the rest come from the agent's call: escaped.
        r = {k: field(v) for k, v in row.items()}
        print(f"{r['id']:<16} {r['agent']:<8} {r['user']:<10} {r['kind']:<10} {r['tool']:<11} "
              f"{r['taint']:<8} {since:<8} {r['target']}")
        if r.get("detail"):
            print(f"{'':<16} {r['detail']}")
    return 0


async def answer(request_id: str, reply: str) -> None:
    client = await Client.connect()
    try:
        await policy_call(client, "Answer", "ss", [request_id, reply])
    finally:
        client.close()


def run_approve(args: argparse.Namespace) -> int:
    asyncio.run(answer(args.request_id, args.answer))
    print(f"{field(args.request_id)}: {args.answer}")
    return 0


_CHOICES = {"o": "once", "once": "once", "s": "session", "session": "session",
            "d": "deny", "deny": "deny", "": "deny"}


class InlinePrompter:
    """For `lev run` on a terminal: ask about the agent's held calls right
    there. Started before the agent (a request may come at once); `wanted`
    holds the agent's id once it is known."""

    def __init__(self, client: Client, wanted: list[str]) -> None:
        self.client = client
        self.wanted = wanted
        self.queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        def on_signal(msg: Message) -> bool:
            if self.client.from_daemon(msg, "ApprovalRequested", POLICY_IFACE):
                rid, agent_id, _uid = msg.body
                self.queue.put_nowait((rid, agent_id))
            return False

        self.client.bus.add_message_handler(on_signal)
        await self.client.add_signal_match("ApprovalRequested", POLICY_IFACE)
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            rid, agent_id = await self.queue.get()
            if agent_id not in self.wanted:
                continue
            # The signal only says that a call waits; what it is, the daemon
            # tells its owner.
            (pending,) = await policy_call(self.client, "ListApprovals")
            req = next((r for r in pending if r["id"].value == rid), None)
            if req is None:
                continue  # answered elsewhere, or timed out
            # The agent chose tool and target: escaped, so the prompt shows
            # what it really asks for and nothing else.
            tool, target, taint = (field(req[k].value) for k in ("tool", "target", "taint"))
            detail = field(req["detail"].value) if "detail" in req else ""
            scope = field(req["scope"].value) if "scope" in req else target
            what = f"{tool} {detail}" if detail else f"{tool} {target}"
            print(f"\nlev: agent {field(agent_id)} wants {what} (taint {taint}). "
                  f"Allow [o]nce, for the [s]ession ({tool} to {scope}), or [d]eny? ",
                  end="", file=sys.stderr, flush=True)
            line = (await _read_line()).strip().lower()
            reply = _CHOICES.get(line, "deny")
            try:
                await policy_call(self.client, "Answer", "ss", [rid, reply])
                print(f"lev: {field(rid)}: {reply}", file=sys.stderr)
            except DaemonError as exc:
                print(f"lev: {field(rid)}: {field(exc)}", file=sys.stderr)


async def _read_line() -> str:
    """One line from the terminal without a thread (a thread blocked in
    read would keep `lev` from exiting)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(0, readable)
    try:
        await ready
    finally:
        loop.remove_reader(0)
    return os.read(0, 4096).decode(errors="replace")
