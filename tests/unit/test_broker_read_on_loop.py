"""Issue 47 item 4: a read_file's worker round trip is awaited on the event
loop, with no thread-pool hop, and the checks on the opened descriptor run
there only where they cannot wait on a server the agent's user runs
(broker/localfs.py). Through a real broker socket on real files; the
decision, the label and the audit record are those of the pool's path."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from broker_harness import Running, call, running_broker

from leviathd.broker import localfs
from leviathd.broker.core import Broker
from leviathd.broker.opener import Opener
from leviathd.broker.tools import READ_FLAGS, FileTools
from leviathd.errors import Unavailable
from leviathd.policy.settings import PolicySettings


def _on_block_device(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        return localfs.local(fd)
    finally:
        os.close(fd)


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    home, work, notes, ssh = (tmp_path / "home", tmp_path / "work", tmp_path / "home/notes",
                              tmp_path / "home/.ssh")
    for d in (work, notes, ssh):
        d.mkdir(parents=True)
    (ssh / "id_ed25519").write_text("PRIVATE KEY")
    (notes / "plan.md").write_text("the plan")
    (work / "main.py").write_text("print('hi')\n")
    return {"home": home, "work": work, "notes": notes, "ssh": ssh, "tmp": tmp_path}


@pytest.fixture
def broker(tree: dict[str, Path]) -> Iterator[Running]:
    settings = PolicySettings(read_paths=["~/notes"], taint_enabled=True)
    with running_broker(home=str(tree["home"]), workdir=str(tree["work"]), settings=settings,
                        socket_path=str(tree["tmp"] / "broker.sock")) as running:
        yield running


def test_a_workdir_read_on_a_disk_takes_no_thread(
    broker: Running, tree: dict[str, Path]
) -> None:
    if not _on_block_device(tree["work"]):
        pytest.skip("the test's folder is not on a block device's file system")
    for _ in range(3):
        reply = call(broker.path, "read_file", {"path": "main.py"})
        assert reply["ok"] and reply["result"]["content"] == "print('hi')\n", reply
    # The agent's pool is made at its first use: none was needed.
    assert broker.broker._pool is None


def test_checks_where_a_server_may_wait_are_made_in_the_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a file system whose fstat and getxattr its server answers (FUSE,
    NFS), the checks run in a pool thread, never on the loop. tmpfs stands
    in for FUSE here: both are on an anonymous device (major 0), which is
    all localfs looks at."""
    if not os.path.isdir("/dev/shm") or _on_block_device(Path("/dev/shm")):
        pytest.skip("no tmpfs at /dev/shm")
    import tempfile

    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        work = Path(shm) / "work"
        work.mkdir()
        (work / "a.txt").write_text("on tmpfs")
        threads: list[threading.Thread] = []
        real_take = FileTools.take_ahead

        def take(self: FileTools, *args: Any) -> Any:
            threads.append(threading.current_thread())
            return real_take(self, *args)

        monkeypatch.setattr(FileTools, "take_ahead", take)
        with running_broker(home=str(tmp_path), workdir=str(work), settings=PolicySettings(),
                            socket_path=str(tmp_path / "b.sock")) as running:
            reply = call(running.path, "read_file", {"path": "a.txt"})
            loop_thread = running.run(threading.current_thread)
    assert reply["ok"] and reply["result"]["content"] == "on tmpfs", reply
    assert threads and all(t is not loop_thread for t in threads), threads


@pytest.mark.parametrize("plant", ["hard link", "symlink", "fifo", "folder"])
def test_what_the_agent_plants_in_the_workdir_is_refused_on_the_loop(
    broker: Running, tree: dict[str, Path], plant: str
) -> None:
    """From the agent's side: a name in its workdir for a hidden file (a
    hard link, a symlink), a FIFO that would hang a reader, a folder. The
    decision is on the descriptor the worker opened, on the loop as in the
    pool: nothing of the key comes back, and each refusal is audited."""
    target = tree["work"] / "x"
    key = tree["ssh"] / "id_ed25519"
    if plant == "hard link":
        os.link(key, target)
    elif plant == "symlink":
        target.symlink_to(key)
    elif plant == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    reply = call(broker.path, "read_file", {"path": "x"})
    assert not reply["ok"], reply
    assert "PRIVATE KEY" not in str(reply)
    assert broker.audit[-1].tool == "read_file"
    assert broker.audit[-1].outcome in ("deny", "error"), broker.audit[-1]


def _records(running: Running) -> list[dict[str, Any]]:
    return [{k: v for k, v in asdict(r).items() if k != "at"} for r in running.audit]


def test_the_loop_and_the_pool_give_the_same_replies_and_records(
    tree: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same calls, once with the loop's path and once with the pool's
    (the view never ready now): the replies and the audit records match."""
    calls = [("read_file", {"path": "main.py"}), ("read_file", {"path": "nope.py"}),
             ("read_file", {"path": str(tree["notes"] / "plan.md")}),
             ("read_file", {"path": str(tree["ssh"] / "id_ed25519")}),
             ("read_file", {"path": "main.py", "max_bytes": 3})]
    seen = []
    for pool in (False, True):
        if pool:
            monkeypatch.setattr(Broker, "_view_now", lambda self: None)
        settings = PolicySettings(read_paths=["~/notes"], taint_enabled=True)
        with running_broker(home=str(tree["home"]), workdir=str(tree["work"]),
                            settings=settings,
                            socket_path=str(tree["tmp"] / f"b{int(pool)}.sock")) as running:
            replies = [call(running.path, tool, args) for tool, args in calls]
            seen.append((replies, _records(running), running.broker._pool is not None))
    (loop_replies, loop_records, _), (pool_replies, pool_records, pool_pool) = seen
    assert loop_replies == pool_replies
    assert loop_records == pool_records
    assert pool_pool


def _worker(tmp_path: Path) -> Opener:
    return Opener(uid=os.getuid(), gid=os.getgid(), groups=os.getgroups())


def test_a_round_trip_abandoned_on_the_loop_ends_the_worker(tmp_path: Path) -> None:
    """A call whose client went away is cancelled while it waits for the
    worker (here stopped, as its user may stop it): its late reply (a
    descriptor of `f`) must never be read as the next request's (for `g`).
    The worker is killed, so the next request finds it gone."""
    (tmp_path / "f").write_text("x")
    (tmp_path / "g").write_text("y")
    opener = _worker(tmp_path)
    try:
        os.kill(opener.pid, signal.SIGSTOP)

        async def scenario() -> None:
            task = asyncio.create_task(opener.open_read_async(
                str(tmp_path / "f"), READ_FLAGS, 100, 1000))
            while not opener._lock.locked():
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(scenario())
        os.kill(opener.pid, signal.SIGCONT)  # alive, it would answer for f first
        with pytest.raises(Unavailable):
            fd, _content = opener.open_read(str(tmp_path / "g"), READ_FLAGS, 100, 1000)
            os.close(fd)
        # Gone (its socket was closed): killed, not ended on its own.
        assert opener._proc.wait() == -signal.SIGKILL
    finally:
        opener.close()


def test_a_worker_busy_for_a_thread_sends_the_loop_to_the_pool(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    opener = _worker(tmp_path)
    try:
        with opener._lock:
            assert asyncio.run(opener.open_read_async(
                str(tmp_path / "f"), READ_FLAGS, 100, 1000)) is None
        got = asyncio.run(opener.open_read_async(str(tmp_path / "f"), READ_FLAGS, 100, 1000))
        assert got is not None
        fd, content = got
        os.close(fd)
        assert content == (b'"x"', False)
    finally:
        opener.close()


@pytest.mark.parametrize("driver", ["loop", "nbd", "ublk", "device-mapper", "blkext"])
def test_a_block_device_a_user_can_back_is_not_taken_for_local(
    monkeypatch: pytest.MonkeyPatch, driver: str
) -> None:
    """A loop device (udisks attaches one to a file of the user's, which may
    sit on her FUSE mount), nbd, ublk, device-mapper over those: their file
    systems' checks go to the pool."""
    monkeypatch.setattr(localfs, "device_major", lambda fd: 300)
    monkeypatch.setattr(localfs, "_drivers", {})
    monkeypatch.setattr(localfs, "block_drivers", lambda: {300: driver})
    assert not localfs.local(0)
    monkeypatch.setattr(localfs, "_drivers", {})
    monkeypatch.setattr(localfs, "block_drivers", lambda: {300: "virtblk"})
    assert localfs.local(0)


def test_an_anonymous_or_unknown_device_is_not_local(monkeypatch: pytest.MonkeyPatch) -> None:
    fd = os.open("/proc/self/status", os.O_RDONLY)
    try:
        assert localfs.device_major(fd) == 0
        assert not localfs.local(fd)
    finally:
        os.close(fd)
    monkeypatch.setattr(localfs, "device_major", lambda fd: 301)
    monkeypatch.setattr(localfs, "_drivers", {})
    monkeypatch.setattr(localfs, "block_drivers", lambda: {})
    assert not localfs.local(0)  # a major no driver claims (yet): not trusted


class _Ended:
    """A view whose fence ended (Opener.stale)."""

    def stale(self) -> bool:
        return True


def test_a_view_whose_fence_ended_is_not_used_from_the_loop(broker: Running) -> None:
    """The loop's path takes the agent's view only while its fence runs; a
    view of an ended fence (the host's tree, an earlier step's mounts) is
    replaced by the pool's path (files_opener), never read through."""
    b = broker.broker
    b._fence = lambda: None
    b._view = _Ended()  # type: ignore[assignment]
    try:
        assert b._view_now() is None
    finally:
        b._view = None


@pytest.mark.parametrize("raw", [b'{"data": 2}\nabc', b'{"data": 20}\nab', b'{"data": 20}'])
def test_a_worker_message_over_its_bounds_is_refused(raw: bytes) -> None:
    """The data sent in the header's packet (one wake-up instead of two) is
    bounded as the rest: no more than the header says, which is no more
    than the reader allows."""
    from leviathd.broker import opener_worker as wire

    with pytest.raises(ValueError):
        wire.split(raw, 10)


def test_a_message_in_one_packet_and_in_several_reads_the_same() -> None:
    import socket

    from leviathd.broker import opener_worker as wire

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with a, b:
        for data in (b"", b"x" * 100, bytes(range(256)) * 600):
            wire.send(a, {"op": "t"}, data)
            header, got, fds = wire.recv(b, 1 << 20)
            assert (header["op"], got, fds) == ("t", data, [])


def test_a_worker_closed_while_the_loop_waits_on_it(tmp_path: Path) -> None:
    """The view's worker is closed (its fence ended, found by a pool thread)
    while a read waits on it on the loop: the read fails by name, and the
    socket is closed only after its reader was removed."""
    (tmp_path / "f").write_text("x")
    opener = _worker(tmp_path)
    nb = opener._nb
    try:
        os.kill(opener.pid, signal.SIGSTOP)

        async def scenario() -> None:
            task = asyncio.create_task(opener.open_read_async(
                str(tmp_path / "f"), READ_FLAGS, 100, 1000))
            while not opener._lock.locked():
                await asyncio.sleep(0)
            opener.close()
            assert nb.fileno() >= 0  # still the loop's until its wait ends
            with pytest.raises(Unavailable):
                await task
            assert nb.fileno() == -1

        asyncio.run(scenario())
    finally:
        opener.close()
