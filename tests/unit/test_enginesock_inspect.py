"""The filter's look-up of a container before each call on it
(proxy.AgentProxy._inspect): only the engine's 404 is "no such container".
podman 4.3 answered one such look-up, of a container that had just exited,
with a non-200 that the filter told the agent as "no such container: pinned"
(tests/integration/test_engine_rootless.py's bind test failed once so): a
5xx is asked again, and one that stays is said as the engine's failure.
Against a stand-in engine on a unix socket that answers as scripted (the real
engine's answers are the bed's)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from leviathd.enginesock import proxy, rules
from leviathd.enginesock.view import View, _Entry

AGENT = "aaaa1111"
MINE = {"Id": "c" * 64, "Name": "/pinned",
        "Config": {"Labels": {rules.LABEL_AGENT: AGENT}}}


async def _look_up(tmp: Path, answers: list[tuple[int, Any]]) -> tuple[Any, int]:
    """`container("pinned")` through a proxy whose engine gives `answers` in
    turn; what it returned (or the Refused), and how many look-ups it made."""
    asked = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal asked
        await reader.readuntil(b"\r\n\r\n")
        status, body = answers[min(asked, len(answers) - 1)]
        asked += 1
        raw = json.dumps(body).encode()
        writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (status, len(raw)) + raw)
        await writer.drain()
        writer.close()

    path = str(tmp / "engine.sock")
    server = await asyncio.start_unix_server(serve, path=path)
    settings = proxy.Settings(agent_id=AGENT, uid=os.getuid(), gid=os.getgid(), cap_add=(),
                              publish_any=False, engine=path, podman=True, daemon="d")
    p = proxy.AgentProxy(settings, View((_Entry("/", "tmpfs", "", False),), (), (), ()),
                         lambda cgroup: AGENT)
    try:
        try:
            got: Any = await p.container("pinned")
        except rules.Refused as exc:
            got = exc
    finally:
        server.close()
    return got, asked


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proxy, "INSPECT_RETRY", (0.0, 0.0, 0.0), raising=False)
    monkeypatch.setattr(proxy.journal, "record", lambda *a, **k: None)


def test_a_container_the_engine_fails_on_once_is_found_when_asked_again(
        tmp_path: Path) -> None:
    got, asked = asyncio.run(_look_up(tmp_path, [
        (500, {"message": "decoding container status: EOF"}), (200, MINE)]))
    assert got == MINE and asked == 2, (got, asked)


def test_an_engine_that_keeps_failing_is_said_so_not_no_such_container(tmp_path: Path) -> None:
    got, asked = asyncio.run(_look_up(tmp_path, [(500, {"message": "ctr c0ffee: lock"})]))
    assert isinstance(got, rules.Refused) and got.status == 502, got
    assert "no such" not in got.message and "could not look up" in got.message, got.message
    assert "c0ffee" not in got.message  # the engine's words stay in the journal
    assert asked == len(proxy.INSPECT_RETRY) + 1


@pytest.mark.parametrize("answers", [
    [(404, {"message": "no such container"})],
    [(200, {**MINE, "Config": {"Labels": {rules.LABEL_AGENT: "bbbb2222"}}})],
])
def test_a_missing_container_and_another_agents_are_no_such_container_at_once(
        tmp_path: Path, answers: list[tuple[int, Any]]) -> None:
    got, asked = asyncio.run(_look_up(tmp_path, answers))
    assert isinstance(got, rules.Refused) and got.status == 404, got
    assert got.message.startswith("no such container: pinned"), got.message
    assert asked == 1
