"""`lev mcp`: the gated tools as an MCP server on stdio (JSON-RPC 2.0, one
message per line), for agent tools that speak MCP. Every tools/call goes to
the broker, so it is gated exactly like `lev tool`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import IO, Any

from leviathd.cli.tool import BrokerClient
from leviathd.errors import LeviathError

PROTOCOL_VERSION = "2025-03-26"
SUPPORTED = ("2024-11-05", "2025-03-26", "2025-06-18")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("mcp", help="serve the gated tools over MCP on stdio (inside a sandbox)")
    p.set_defaults(func=run)


def tools_list() -> list[dict[str, Any]]:
    from leviathd.domain.tools import TOOLS, ToolKind

    # The git tools are git's credential helper's and ssh_sign the SSH agent's:
    # a model is not offered tokens (a direct call still meets the same gate).
    return [
        {"name": s.name, "description": s.description, "inputSchema": s.input_schema()}
        for s in TOOLS.values() if s.kind not in (ToolKind.GIT, ToolKind.SSH)
    ]


class McpServer:
    def __init__(self, client: BrokerClient) -> None:
        self.client = client

    def tools(self) -> list[dict[str, Any]]:
        """The broker's list (built-in tools and the blueprint's own); the
        built-in list alone from a broker too old to say."""
        try:
            reply = self.client.request({"op": "tools"})
        except LeviathError:
            reply = {}
        listed = reply.get("tools") if reply.get("ok") else None
        if not isinstance(listed, list):
            return tools_list()
        return [{"name": str(t.get("name")), "description": str(t.get("description", "")),
                 "inputSchema": t.get("inputSchema") or {"type": "object"}}
                for t in listed if isinstance(t, dict)]

    def handle(self, msg: Any) -> dict[str, Any] | None:
        if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
            return _err(None, -32600, "invalid request")
        mid = msg.get("id")
        method = msg.get("method")
        if mid is None:  # a notification (e.g. notifications/initialized)
            return None
        params = msg.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            # JSON-RPC allows by-position params; no method here takes them.
            return _err(mid, -32602, "invalid params: params must be an object")
        if method == "initialize":
            asked = params.get("protocolVersion")
            return _ok(mid, {
                "protocolVersion": asked if asked in SUPPORTED else PROTOCOL_VERSION,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "leviathd-broker", "version": "0.1.0"},
            })
        if method == "ping":
            return _ok(mid, {})
        if method == "tools/list":
            return _ok(mid, {"tools": self.tools()})
        if method == "tools/call":
            name = params.get("name")
            arguments = params.get("arguments") or {}
            if not isinstance(name, str) or not isinstance(arguments, dict):
                return _err(mid, -32602, "tools/call needs name and arguments")
            try:
                reply = self.client.call(name, arguments)
            except LeviathError as exc:
                reply = {"ok": False, "error": {"code": "unavailable", "message": str(exc)}}
            if reply.get("ok"):
                result = reply.get("result")
                text = json.dumps(result, ensure_ascii=False, indent=1)
                return _ok(mid, {
                    "content": [{"type": "text", "text": text}],
                    "structuredContent": result if isinstance(result, dict) else {"value": result},
                    "isError": False,
                })
            err = reply.get("error") or {}
            text = f"{err.get('code', 'error')}: {err.get('message', 'refused')}"
            return _ok(mid, {"content": [{"type": "text", "text": text}], "isError": True})
        return _err(mid, -32601, f"method not found: {method}")

    def serve(self, stdin: IO[str], stdout: IO[str]) -> None:
        for line in stdin:
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except (ValueError, RecursionError):
                reply: dict[str, Any] | None = _err(None, -32700, "parse error")
            else:
                try:
                    reply = self.handle(msg)
                except Exception as exc:  # one bad message never ends the server
                    mid = msg.get("id") if isinstance(msg, dict) else None
                    reply = _err(mid, -32603, f"internal error: {type(exc).__name__}")
            if reply is not None:
                stdout.write(json.dumps(reply, ensure_ascii=False) + "\n")
                stdout.flush()


def _ok(mid: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": mid, "result": result}


def _err(mid: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": mid, "error": {"code": code, "message": message}}


def run(args: argparse.Namespace) -> int:
    client = BrokerClient()
    try:
        McpServer(client).serve(sys.stdin, sys.stdout)
    finally:
        client.close()
    return 0
