"""Red team, agents/output.py: whose identity the agent's last lines carry.
The daemon speaks to journald for the agent (SCM_CREDENTIALS); once the
agent's PID 1 has ended, a line must never go out as the daemon itself
(journald would file the agent's text under leviathd.service) nor as a
pid the kernel may since have given to someone else's process."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import time

import pytest

from leviathd.agents import output


def _senders(sock: socket.socket) -> list[tuple[int, bytes]]:
    """(pid, data) of each message read from `sock` (SO_PASSCRED)."""
    got: list[tuple[int, bytes]] = []
    sock.setblocking(False)
    while True:
        try:
            data, anc, _flags, _addr = sock.recvmsg(1 << 20, socket.CMSG_SPACE(12))
        except BlockingIOError:
            return got
        if not data:
            return got
        pid = next((struct.unpack("iII", d)[0] for lvl, typ, d in anc
                    if lvl == socket.SOL_SOCKET and typ == socket.SCM_CREDENTIALS), -1)
        got.append((pid, data))


async def _copy_through_an_end(zombie: int | None, monkeypatch: pytest.MonkeyPatch,
                               ) -> tuple[int, list[tuple[int, bytes]]]:
    pid1 = subprocess.Popen(["sleep", "30"])
    journals = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
    for _ours, theirs in journals:
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    given = iter(ours for ours, _theirs in journals)
    monkeypatch.setattr(output, "_connect", lambda unit, priority: next(given))
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    copy = output.OutputCopy("a1", "x.scope", 65534, 65534, (out_r, err_r), zombie=zombie)
    copy.start(pid1.pid)
    os.write(out_w, b"while-alive\n")
    await asyncio.sleep(0.2)
    pid1.kill()
    pid1.wait()  # reaped: its pid is free for anyone's next process
    os.write(out_w, b"after-the-end\n")
    os.close(out_w)
    os.close(err_w)
    await copy.finish()
    return pid1.pid, _senders(journals[0][1])


def test_without_the_held_zombie_the_last_lines_never_go_out_as_the_daemon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A restarted daemon holds no zombie of the agent's: after PID 1's end
    its lines went out with the daemon's own pid (seen failing: the
    journal filed them under the daemon's unit, `lev logs` missed them)."""
    pid1, sent = asyncio.run(_copy_through_an_end(None, monkeypatch))
    assert sent and sent[0] == (pid1, b"while-alive\n"), sent
    assert all(pid != os.getpid() for pid, _data in sent), sent
    assert all(pid == pid1 for pid, _data in sent), sent


def test_with_the_held_zombie_the_last_lines_go_out_as_the_zombie(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    zombie = os.fork()
    if zombie == 0:
        os._exit(0)
    time.sleep(0.1)
    try:
        pid1, sent = asyncio.run(_copy_through_an_end(zombie, monkeypatch))
        assert sent[0] == (pid1, b"while-alive\n"), sent
        assert b"after-the-end\n" in b"".join(d for _p, d in sent), sent
        assert all(pid in (pid1, zombie) for pid, _data in sent), sent
        assert [p for p, d in sent if b"after-the-end" in d] == [zombie], sent
    finally:
        try:
            os.waitpid(zombie, 0)
        except ChildProcessError:
            pass


def _pid1_holding(keep: tuple[int, int] | None) -> tuple[int, int]:
    """A process that is PID 1 of a PID namespace of its own and holds
    `keep` at 7 and 6 (the kept read ends); its host pid and a pipe whose
    end says it is up."""
    from leviathd.sandbox.namespace import syscalls

    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            syscalls.unshare(syscalls.CLONE_NEWPID)
            inner = os.fork()
            if inner == 0:
                if keep is not None:
                    os.dup2(keep[0], 7)
                    os.dup2(keep[1], 6)
                os.write(ready_w, b"x")
                time.sleep(30)
            os.waitpid(inner, 0)
        finally:
            os._exit(0)
    os.read(ready_r, 1)
    os.close(ready_r)
    os.close(ready_w)
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return pid, int(f.read().split()[0])


def test_a_restarted_daemon_takes_pid1s_kept_read_ends_and_only_those() -> None:
    """Guard of the take-back: PID 1 of its own namespace with pipes'
    read ends at 7 and 6 gives them; one with write ends, or a process that
    is not such a PID 1, gives none. Passed before (the pidfd-first order
    that closes the pid-reuse window is not shown failing: the window is a
    few microseconds and a pid wrap)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    outer, pid1 = _pid1_holding((out_r, err_r))
    try:
        taken = output.take_kept(pid1)
        assert taken is not None
        os.write(out_w, b"o")
        os.write(err_w, b"e")
        assert os.read(taken[0], 1) == b"o" and os.read(taken[1], 1) == b"e"
        for fd in taken:
            os.close(fd)
        assert output.take_kept(outer) is None  # not 1 in its namespace
    finally:
        os.kill(pid1, 9)
        os.waitpid(outer, 0)
    outer, pid1 = _pid1_holding((out_w, err_w))
    try:
        assert output.take_kept(pid1) is None  # write ends are not taken
    finally:
        os.kill(pid1, 9)
        os.waitpid(outer, 0)
    assert output.take_kept(pid1) is None  # ended
    for fd in (out_r, out_w, err_r, err_w):
        os.close(fd)
