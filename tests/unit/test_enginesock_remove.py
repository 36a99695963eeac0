"""enginesock/engine.py remove: at an agent's end (or the daemon's start) the
engine's things go only when they carry this daemon's label and an agent's
that is not kept; another daemon's, an unlabelled one's and a live agent's
stay. Against a stand-in engine on a real unix socket (the listing is
scripted; the DELETEs it receives are recorded)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from leviathd.enginesock import engine
from leviathd.enginesock.rules import LABEL_AGENT, LABEL_DAEMON

ITEMS = [
    {"Id": "mine-dead", "Labels": {LABEL_DAEMON: "d", LABEL_AGENT: "dead0001"}},
    {"Id": "mine-live", "Labels": {LABEL_DAEMON: "d", LABEL_AGENT: "live0002"}},
    {"Id": "other-daemon", "Labels": {LABEL_DAEMON: "e", LABEL_AGENT: "dead0001"}},
    {"Id": "no-agent", "Labels": {LABEL_DAEMON: "d"}},
]


async def _remove(tmp: Path) -> tuple[int, list[str]]:
    deleted: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, path = head.decode().split(" ")[:2]
        body: object = {}
        if method == "DELETE":
            deleted.append(path)
        elif path.startswith("/volumes"):
            body = {"Volumes": ITEMS}
        else:
            body = ITEMS if path.startswith("/containers") else []
        raw = json.dumps(body).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
        await writer.drain()
        writer.close()

    path = str(tmp / "engine.sock")
    server = await asyncio.start_unix_server(serve, path=path)
    try:
        gone = await engine.remove(path, "d", {"live0002"})
    finally:
        server.close()
    return gone, deleted


def test_only_this_daemons_things_of_agents_not_kept_are_removed(tmp_path: Path) -> None:
    gone, deleted = asyncio.run(_remove(tmp_path))
    assert deleted == ["/containers/mine-dead?force=1&v=1", "/volumes/mine-dead?force=1"]
    assert gone == 2
