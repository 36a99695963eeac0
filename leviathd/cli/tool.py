"""`lev tool NAME [ARGS...|--json JSON]`: call a gated tool from inside an
agent's sandbox, through the broker socket mounted there."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import socket
import sys
import time
from typing import Any

from leviathd.errors import InvalidArgument, LeviathError, Unavailable

DEFAULT_SOCKET = "/run/leviath/broker.sock"
OUTSIDE_AN_AGENT = (
    "lev tool and lev mcp work only inside an agent, where they reach its broker "
    f"({DEFAULT_SOCKET}); try one: lev run -- lev tool --ledger"
)


def broker_socket() -> str:
    return os.environ.get("LEVIATH_BROKER", DEFAULT_SOCKET)


# How long a call waits for a broker that is not there: a daemon restart
# (its brokers come back with it, about a second) must not fail an agent's
# calls; a daemon that stays down must not hang them.
RECONNECT_SECONDS = 10.0
# The broker is away, not refusing: its socket is gone or nobody listens.
_AWAY = (errno.ENOENT, errno.ECONNREFUSED, errno.EAGAIN)


class BrokerClient:
    """A blocking JSON-lines client; one request at a time."""

    def __init__(self, path: str | None = None, *, wait: float = RECONNECT_SECONDS) -> None:
        self.path = path or broker_socket()
        if "LEVIATH_BROKER" not in os.environ and not os.path.exists(self.path):
            raise Unavailable(OUTSIDE_AN_AGENT)
        self._sock = _connect(self.path, wait)
        self._file = self._sock.makefile("rb")
        self._next = 0

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        self._next += 1
        payload = {**payload, "id": self._next}
        # A refused peer: the broker said why and closed; the reason is read below.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._sock.sendall(json.dumps(payload).encode() + b"\n")
        try:
            line = self._file.readline()
        except ConnectionResetError:
            line = b""
        if not line:
            raise Unavailable("the broker closed the connection")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        return self.request({"op": "call", "tool": tool, "args": args})

    def close(self) -> None:
        self._file.close()
        self._sock.close()


def _connect(path: str, wait: float) -> socket.socket:
    """Connect, retrying for up to `wait` seconds while the broker is away
    (a daemon restart unlinks and re-creates the socket)."""
    deadline = time.monotonic() + wait
    pause = 0.05
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError as exc:
            sock.close()
            left = deadline - time.monotonic()
            if exc.errno not in _AWAY or left <= 0:
                raise Unavailable(f"cannot reach the broker at {path}: {exc.strerror}"
                                  + (f" (waited {wait:.0f} s)" if exc.errno in _AWAY else "")
                                  ) from None
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.5)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tool",
        help="call a gated tool through the agent's broker (inside a sandbox)",
        description="Call a tool through the broker ($LEVIATH_BROKER or "
        f"{DEFAULT_SOCKET}). `lev tool list` lists the tools this agent has (the "
        "built-in ones and its blueprint's); `lev tool --ledger` shows the taint ledger; "
        "`lev tool --evict ID...` reports entries dropped from the agent's context.",
    )
    p.add_argument("name", nargs="?", help="tool name, e.g. read_file, or list")
    p.add_argument("args", nargs="*", help="positional arguments of the tool")
    p.add_argument("--json", dest="json_args", metavar="JSON", help="arguments as a JSON object")
    p.add_argument("--ledger", action="store_true", help="print the taint ledger")
    p.add_argument("--evict", nargs="+", type=int, metavar="ID", help="drop ledger entries")
    p.set_defaults(func=run)


def build_args(
    name: str, positional: list[str], json_args: str | None,
    tools: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`tools`: the broker's list (`lev tool list`), for a blueprint tool's
    positional arguments: taken in the order its schema declares them."""
    from leviathd.broker.schema import args_from_positional
    from leviathd.domain.tools import TOOLS as TOOL_SPECS

    if json_args is not None:
        if positional:
            raise InvalidArgument("give either positional arguments or --json, not both")
        try:
            parsed = json.loads(json_args)
        except ValueError as exc:
            raise InvalidArgument(f"--json: {exc}") from None
        if not isinstance(parsed, dict):
            raise InvalidArgument("--json must be a JSON object")
        return parsed
    own = next((t for t in tools or () if t.get("name") == name
                and t.get("source") == "blueprint"), None)
    if own is not None and name not in TOOL_SPECS:
        return _blueprint_positional(name, own.get("inputSchema") or {}, positional)
    if name not in TOOL_SPECS and not positional:
        return {}  # a tool the list does not show (denied, or nobody's): the broker says
    args = args_from_positional(name, positional)
    if name == "write_file" and "content" not in args and "path" in args:
        args["content"] = sys.stdin.read()
    return args


def _blueprint_positional(
    name: str, schema: dict[str, Any], values: list[str]
) -> dict[str, Any]:
    props = list((schema.get("properties") or {}).items())
    if len(values) > len(props):
        raise InvalidArgument(f"{name}: too many arguments (it takes {len(props)})")
    out: dict[str, Any] = {}
    for (prop, sub), text in zip(props, values, strict=False):
        kind = sub.get("type", "string") if isinstance(sub, dict) else "string"
        try:
            out[prop] = (int(text) if kind == "integer" else float(text) if kind == "number"
                         else text == "true" if kind == "boolean" and text in ("true", "false")
                         else text)
        except ValueError:
            raise InvalidArgument(f"{name}: argument {prop!r} must be a {kind}") from None
    return out


def tool_rows(tools: list[dict[str, Any]]) -> list[str]:
    from leviathd.cli.text import field

    width = max((len(str(t.get("name", ""))) for t in tools), default=4)
    rows = []
    for t in tools:
        extra = ""
        if t.get("source") == "blueprint":
            extra = f" [blueprint; output {t.get('output')}"
            extra += "; sends data out]" if t.get("sends_data") else "]"
        rows.append(f"{field(str(t.get('name', '')))[:64]:<{width}}  "
                    f"{field(str(t.get('description', '')))[:300]}{field(extra)}")
    return rows


def run(args: argparse.Namespace) -> int:
    client = BrokerClient()
    try:
        if args.ledger:
            reply = client.request({"op": "ledger"})
        elif args.evict:
            reply = client.request({"op": "evict", "ids": args.evict})
        elif args.name == "list" and not args.args:
            reply = client.request({"op": "tools"})
            if reply.get("ok"):
                listed = list(reply.get("tools") or [])
                # `lev tool list --json {}`: the list as JSON, schemas and all.
                print("\n".join(tool_rows(listed)) if args.json_args is None
                      else json.dumps(listed, indent=2, ensure_ascii=False))
                return 0
        elif args.name:
            from leviathd.domain.tools import TOOLS as TOOL_SPECS

            tools = None
            if args.name not in TOOL_SPECS and args.json_args is None:
                known = client.request({"op": "tools"})
                tools = list(known.get("tools") or []) if known.get("ok") else None
            reply = client.call(args.name, build_args(args.name, args.args, args.json_args,
                                                      tools))
        else:
            raise InvalidArgument("name a tool, or use --ledger / --evict")
    finally:
        client.close()
    if not reply.get("ok"):
        err = reply.get("error") or {}
        raise LeviathError(f"{err.get('code', 'error')}: {err.get('message', 'refused')}")
    result = reply.get("result")
    if args.name == "read_file" and isinstance(result, dict) and "content" in result:
        sys.stdout.write(str(result["content"]))
    else:
        print(json.dumps(result if args.name else reply, indent=2, ensure_ascii=False))
    return 0
