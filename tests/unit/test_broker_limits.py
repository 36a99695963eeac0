"""The broker's limits and its refusals, on a real broker socket: every
limit is refused by name (`too-large` with the limit), the connection goes
on, and a refused path says nothing of what exists behind it."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_harness import Running, call, running_broker

from leviathd.broker.requests import json_depth_within
from leviathd.domain.brokerlimits import Limits
from leviathd.domain.sensitivity import Sensitivity
from leviathd.policy.approvals import ApprovalQueue
from leviathd.policy.settings import PolicySettings

KIB = 1 << 10

LIMITS = Limits(read_max_bytes=4 * KIB, read_max_paths=5, reply_max_bytes=16 * KIB,
                edit_max_bytes=8 * KIB, request_max_bytes=8 * KIB, json_max_depth=8,
                max_concurrent_calls=2, max_connections=3, max_pending_approvals=2)


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    home = tmp_path / "home"
    work = tmp_path / "work"
    ssh = home / ".ssh"
    for d in (work, ssh, home / "notes"):
        d.mkdir(parents=True)
    (ssh / "id_ed25519").write_text("PRIVATE KEY")
    (home / "notes" / "n.txt").write_text("note")
    for i in range(5):
        (work / f"f{i}").write_text("a" * (6 * KIB))
    (work / "small.txt").write_text("small\n")
    (work / "big.txt").write_text("needle " + "b" * (10 * KIB))
    os.symlink(ssh / "id_ed25519", work / "key")
    os.symlink(ssh / "no_such_key", work / "nokey")
    os.symlink(ssh, work / "sshdir")
    os.symlink(home / ".no_such_dir", work / "nodir")
    os.symlink("..", work / "up")
    os.symlink(work / "missing", work / "dangling")
    return {"home": home, "work": work, "ssh": ssh, "tmp": tmp_path}


@pytest.fixture
def broker(tree: dict[str, Path]) -> Iterator[Running]:
    settings = PolicySettings(read_paths=["~/notes"], limits=LIMITS)
    with running_broker(home=str(tree["home"]), workdir=str(tree["work"]), settings=settings,
                        socket_path=str(tree["tmp"] / "broker.sock")) as running:
        yield running


class Conn:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # A broker that never answers (a mutant that serves what it should
        # refuse) fails the test in time instead of holding it.
        self.sock.settimeout(120)
        self.sock.connect(path)
        self.file = self.sock.makefile("rb")

    def send(self, raw: bytes) -> dict:
        self.sock.sendall(raw + b"\n")
        return dict(json.loads(self.file.readline()))

    def call(self, tool: str, **args: object) -> dict:
        return self.send(json.dumps({"op": "call", "tool": tool, "args": args}).encode())

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def limit_of(reply: dict) -> str:
    assert not reply["ok"], reply
    assert reply["error"]["code"] == "too-large", reply
    return str(reply["error"]["limit"])


def test_deep_json_is_refused_by_name_and_the_connection_goes_on(broker: Running) -> None:
    c = Conn(broker.path)
    reply = c.send(b"[" * 4000 + b"]" * 4000)
    assert limit_of(reply) == "json_max_depth" and reply["error"]["max"] == 8
    assert c.call("read_file", path="small.txt")["ok"]
    c.close()


def test_depth_scan_ignores_brackets_in_strings() -> None:
    assert json_depth_within(json.dumps({"a": "[[[[[[[[[[[[[[" * 10}).encode(), 2)
    assert json_depth_within(json.dumps({"a": "\\\"[[[[[[[[[[["}).encode(), 2)
    assert not json_depth_within(b'{"a": [[[[1]]]]}', 3)
    assert json_depth_within(b'{"a": [[[[1]]]]}', 5)


def test_an_over_long_line_is_refused_by_name_and_the_connection_goes_on(
    broker: Running,
) -> None:
    c = Conn(broker.path)
    big = json.dumps({"op": "call", "tool": "write_file",
                      "args": {"path": "w", "content": "x" * (100 * KIB)}}).encode()
    assert limit_of(c.send(big)) == "request_max_bytes"
    assert c.call("read_file", path="small.txt")["ok"]
    c.close()


def test_too_many_paths_and_a_reply_over_its_limit_are_bounded(broker: Running) -> None:
    reply = call(broker.path, "read_files", {"paths": [f"f{i}" for i in range(6)]})
    assert limit_of(reply) == "read_max_paths"
    reply = call(broker.path, "read_files", {"paths": [f"f{i}" for i in range(5)]})
    assert reply["ok"], reply
    assert len(json.dumps(reply)) <= LIMITS.reply_max_bytes
    files = reply["result"]["files"]
    assert len(files) == 5
    assert files[0]["truncated"] and len(files[0]["content"]) == 4 * KIB
    # The later files are cut to what room is left, and say so.
    assert files[4]["truncated"] and len(files[4]["content"]) < 4 * KIB, files[4]


def test_an_edit_of_a_file_over_the_limit_is_refused_by_name(broker: Running) -> None:
    reply = call(broker.path, "edit_file", {"path": "big.txt", "old": "needle", "new": "x"})
    assert limit_of(reply) == "edit_max_bytes"
    reply = call(broker.path, "edit_file", {"path": "small.txt", "old": "small", "new": "tiny"})
    assert reply["ok"] and reply["result"]["replacements"] == 1, reply


def test_connections_per_agent_are_capped_with_a_named_refusal(broker: Running) -> None:
    held = [Conn(broker.path) for _ in range(3)]
    extra = Conn(broker.path)
    reply = json.loads(extra.file.readline())
    assert limit_of(reply) == "max_connections"
    extra.close()
    held.pop().close()
    again = Conn(broker.path)
    assert again.call("read_file", path="small.txt")["ok"]
    for c in [*held, again]:
        c.close()


def test_a_refused_path_gets_one_message_whatever_exists_behind_it(broker: Running) -> None:
    messages = {}
    for name in ("key", "nokey", "sshdir", "nodir", "up"):
        reply = call(broker.path, "read_file", {"path": name})
        assert not reply["ok"], reply
        messages[name] = reply["error"]["message"].replace(name, "NAME")
    assert len(set(messages.values())) == 1, messages
    text = json.dumps(messages)
    assert ".ssh" not in text and "PRIVATE" not in text and "home" not in text, messages
    listed = {call(broker.path, "list_dir", {"path": n})["error"]["message"].replace(n, "N")
              for n in ("sshdir", "nodir")}
    assert len(listed) == 1, listed
    written = {call(broker.path, "write_file", {"path": f"{n}/x", "content": "y"})["error"][
        "message"].replace(n, "N") for n in ("sshdir", "nodir")}
    assert len(written) == 1, written


def test_a_missing_file_inside_the_view_still_says_so(broker: Running) -> None:
    reply = call(broker.path, "read_file", {"path": "dangling"})
    assert not reply["ok"] and "No such file" in reply["error"]["message"], reply
    reply = call(broker.path, "read_file", {"path": "nothere.txt"})
    assert not reply["ok"] and "No such file" in reply["error"]["message"], reply


async def _ask(q: ApprovalQueue) -> object:
    return await q.ask(kind="permission", tool="t", target="x", taint=Sensitivity.PUBLIC,
                       clearance=None, rule="r")


def test_pending_approvals_per_agent_are_capped() -> None:
    import asyncio

    from leviathd.errors import LimitExceeded

    async def main() -> None:
        q = ApprovalQueue(agent_id="a", owner_uid=1, timeout=5, max_pending=2)
        held = [asyncio.ensure_future(_ask(q)) for _ in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(LimitExceeded) as info:
            await _ask(q)
        assert info.value.limit == "max_pending_approvals"
        for t in held:
            t.cancel()

    asyncio.run(main())


def test_a_stopped_worker_costs_one_timeout_then_a_new_worker_answers(
    broker: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal
    import time

    from leviathd.broker import opener

    monkeypatch.setattr(opener, "TIMEOUT", 1.0)
    broker.broker.close()  # the next worker starts with the short timeout
    assert call(broker.path, "read_file", {"path": "small.txt"})["ok"]
    worker = broker.broker._opener
    assert worker is not None
    os.kill(worker.pid, signal.SIGSTOP)  # as the agent's user could
    t0 = time.monotonic()
    reply = call(broker.path, "read_file", {"path": "small.txt"})
    assert reply["ok"], reply
    assert time.monotonic() - t0 > 0.9  # the stopped worker's timeout was waited out
    assert broker.broker._opener is not None and broker.broker._opener.pid != worker.pid


def test_broker_connections_over_all_agents_are_half_the_daemons_file_limit() -> None:
    """Issue 50: the broker's share of the daemon's descriptors (limits.py):
    half its soft limit, the rest kept for its own work."""
    import resource

    from leviathd.broker.limits import descriptor_budget

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert descriptor_budget() == max(8, soft // 2)


def test_a_line_that_never_ends_is_held_to_its_bound_and_refused() -> None:
    """Issue 50: a request line past its limit is dropped as it comes (the
    daemon never holds more than the limit and a chunk of it) and reported
    as too long when the stream ends, not taken as a clean end."""
    import asyncio

    from leviathd.broker.requests import CHUNK, Lines, TooLong

    async def go() -> int:
        reader = asyncio.StreamReader()
        lines = Lines(reader)
        for _ in range(64):
            reader.feed_data(b"x" * CHUNK)
        reader.feed_eof()
        with pytest.raises(TooLong):
            await lines.next(4 * CHUNK)
        return len(lines.buf)

    assert asyncio.run(go()) <= 5 * CHUNK
