"""Issue 49, item 5: the healthcheck timer of an agent's rootless engine
(leviathd/enginesock/health.py). The interval an agent asks for is never
under the floor, and a running container of the agent's with a check gets
the engine's libpod healthcheck request; one without a check, or another
agent's, gets none. The engine is a stand-in on a real unix socket that
records the requests (the engine's own behaviour is the bed's:
tests/integration/test_engine_clients.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from leviathd.enginesock import health, rules

SECOND = 1_000_000_000


@pytest.mark.parametrize(("check", "seconds"), [
    ({"Test": ["CMD", "true"], "Interval": 1}, 10.0),
    ({"Test": ["CMD", "true"], "Interval": 5 * SECOND}, 10.0),
    ({"Test": ["CMD-SHELL", "true"], "Interval": 60 * SECOND}, 60.0),
    ({"Test": ["CMD", "true"]}, 30.0),
    ({"Test": ["CMD", "true"], "Interval": -5}, 30.0),
    ({"Test": ["NONE"], "Interval": SECOND}, None),
    ({"Test": []}, None),
    (None, None),
])
def test_the_interval_is_the_containers_never_under_the_floor(
        check: dict[str, Any] | None, seconds: float | None) -> None:
    assert health.interval_of({"Healthcheck": check}) == seconds


def _container(cid: str, agent: str, check: dict[str, Any] | None) -> dict[str, Any]:
    return {"Id": cid, "Config": {"Labels": {rules.LABEL_AGENT: agent}, "Healthcheck": check}}


@pytest.mark.timeout(60)
def test_only_the_agents_own_checked_containers_are_checked(tmp_path: Path,
                                                           monkeypatch: Any) -> None:
    monkeypatch.setattr(health, "MIN_INTERVAL", 0.05)
    sock = str(tmp_path / "engine.sock")
    check = {"Test": ["CMD", "true"], "Interval": 1}
    inspect = {"a" * 64: _container("a" * 64, "me", check),
               "b" * 64: _container("b" * 64, "me", None),
               "c" * 64: _container("c" * 64, "other", check)}
    seen: list[str] = []

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = (await r.readuntil(b"\r\n\r\n")).decode()
        path = head.split(" ")[1]
        seen.append(path)
        if path.startswith("/containers/json"):
            body: Any = [{"Id": cid} for cid in inspect]
        elif path.startswith("/containers/"):
            body = inspect[path.split("/")[2]]
        else:
            body = {"Status": "healthy"}
        data = json.dumps(body).encode()
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                b"\r\n" % len(data) + data)
        await w.drain()
        w.close()

    async def go() -> None:
        server = await asyncio.start_unix_server(serve, sock)
        timer = health.Health(sock, "me")
        timer.kick()
        want = f"/v4.0.0/libpod/containers/{'a' * 64}/healthcheck"
        try:
            while seen.count(want) < 2:
                await asyncio.sleep(0.01)
        finally:
            await timer.close()
            server.close()
        checked = {p.split("/")[4] for p in seen if p.endswith("/healthcheck")}
        assert checked == {"a" * 64}, seen
        assert '"label": ["org.leviath.engine-agent=me"]' in unquote(seen[0]), seen[0]

    asyncio.run(go())
