"""`lev mcp`: an MCP server on stdio whose tools/call is gated by the broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from broker_harness import running_broker

from leviathd.policy.settings import PolicySettings

ROOT = Path(__file__).resolve().parents[2]


def _session(broker_path: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run the real `lev mcp` entry point in a child process over stdio."""
    env = {**os.environ, "LEVIATH_BROKER": broker_path, "PYTHONPATH": str(ROOT)}
    code = ("import argparse, sys; from leviathd.cli.mcp import run; "
            "sys.exit(run(argparse.Namespace()))")
    stdin = "".join(json.dumps(m) + "\n" for m in messages)
    out = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True,
                         text=True, env=env, timeout=30, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def test_mcp_initialises_lists_the_gated_tools_and_calls_them(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("alpha")
    with running_broker(home=str(tmp_path / "home"), workdir=str(work),
                        settings=PolicySettings(), socket_path=str(tmp_path / "b.sock")) as b:
        replies = _session(b.path, [
            {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                        "clientInfo": {"name": "t", "version": "0"}}},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
             "params": {"name": "read_file", "arguments": {"path": "a.txt"}}},
            {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
             "params": {"name": "read_file", "arguments": {"path": "/etc/passwd"}}},
            {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
             "params": {"name": "rm_rf", "arguments": {}}},
            {"jsonrpc": "2.0", "id": 6, "method": "nope"},
        ])
        audit = list(b.audit)
    by_id = {r["id"]: r for r in replies}
    assert set(by_id) == {1, 2, 3, 4, 5, 6}  # the notification got no reply
    assert by_id[1]["result"]["protocolVersion"] == "2025-03-26"
    assert "tools" in by_id[1]["result"]["capabilities"]
    names = {t["name"] for t in by_id[2]["result"]["tools"]}
    assert {"read_file", "http_post", "credential"} <= names
    assert not names & {"git_fetch", "git_push"}  # git's helper's, not offered to a model
    schema = next(t for t in by_id[2]["result"]["tools"] if t["name"] == "read_file")
    assert schema["inputSchema"]["required"] == ["path"]
    assert by_id[3]["result"]["isError"] is False
    assert by_id[3]["result"]["structuredContent"]["content"] == "alpha"
    assert by_id[4]["result"]["isError"] is True
    assert "not granted" in by_id[4]["result"]["content"][0]["text"]
    assert by_id[5]["result"]["isError"] is True
    assert by_id[6]["error"]["code"] == -32601
    # The calls went through the broker's gate, which audited each one.
    assert [r.outcome for r in audit] == ["allow", "deny", "deny"]


def test_mcp_answers_a_parse_error_and_goes_on(tmp_path: Path) -> None:
    from io import StringIO

    from leviathd.cli.mcp import McpServer

    class NoBroker:
        def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
            raise AssertionError("not called")

    out = StringIO()
    McpServer(NoBroker()).serve(  # type: ignore[arg-type]
        StringIO('not json\n{"jsonrpc": "2.0", "id": 9, "method": "ping"}\n'), out)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert lines[0]["error"]["code"] == -32700
    assert lines[1] == {"jsonrpc": "2.0", "id": 9, "result": {}}


def test_mcp_answers_params_given_as_a_list_with_an_error_and_goes_on(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    with running_broker(home=str(tmp_path / "home"), workdir=str(work),
                        settings=PolicySettings(), socket_path=str(tmp_path / "b.sock")) as b:
        replies = _session(b.path, [
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ["read_file", {}]},
            {"jsonrpc": "2.0", "id": 2, "method": "initialize", "params": [1, 2]},
            {"jsonrpc": "2.0", "id": 3, "method": "ping"},
        ])
    assert replies[0]["id"] == 1 and replies[0]["error"]["code"] == -32602, replies
    assert replies[1]["id"] == 2 and replies[1]["error"]["code"] == -32602, replies
    assert replies[2] == {"jsonrpc": "2.0", "id": 3, "result": {}}
