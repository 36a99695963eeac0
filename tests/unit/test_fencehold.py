"""The daemon's end of the shell tool's hold (sandbox/fencehold.py), with a
real forked child on a real socket pair: the pid comes from the kernel, and
a mark that fails leaves the child unanswered."""

from __future__ import annotations

import asyncio
import os

import pytest

from leviathd.sandbox import fencehold


def _child(fd: int, ours: int) -> int:
    pid = os.fork()
    if pid == 0:
        os.close(ours)  # as the exec does in gate/shell.py's process
        os.write(fd, b"r")
        answer = os.read(fd, 1)
        os._exit(0 if answer == b"g" else 3)
    return pid


def _status(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_the_mark_gets_the_writers_pid_and_the_child_goes_on() -> None:
    ours, theirs = fencehold.pair()
    pid = _child(theirs.fileno(), ours.fileno())
    theirs.close()
    seen: list[int] = []
    asyncio.run(fencehold.release(ours, seen.append))
    assert seen == [pid]
    assert _status(pid) == 0


def test_a_failed_mark_leaves_the_child_unanswered() -> None:
    ours, theirs = fencehold.pair()
    pid = _child(theirs.fileno(), ours.fileno())
    theirs.close()

    def fail(_pid: int) -> None:
        raise RuntimeError("cannot mark")

    with pytest.raises(RuntimeError):
        asyncio.run(fencehold.release(ours, fail))
    assert _status(pid) == 3


def test_a_child_that_ends_without_a_word_releases_nothing() -> None:
    ours, theirs = fencehold.pair()
    theirs.close()
    seen: list[int] = []
    asyncio.run(fencehold.release(ours, seen.append))
    assert seen == []


def test_a_word_whose_sender_the_kernel_cannot_name_marks_nobody() -> None:
    """Issue 50: a pid of 0 in the credentials (a sender outside our view)
    is no pid to mark."""
    import socket

    creds = [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, fencehold._UCRED.pack(0, 0, 0))]
    assert fencehold._sender(creds) is None
    creds = [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, fencehold._UCRED.pack(4242, 0, 0))]
    assert fencehold._sender(creds) == 4242


@pytest.mark.parametrize("answer", [b"", b"n"], ids=["gone", "other"])
def test_the_fence_fails_without_the_daemons_go(answer: bytes) -> None:
    """Issue 50: the fence's end goes on only on the daemon's "g" (writes
    watched); the daemon gone, or any other word, fails the fence."""
    ours, theirs = fencehold.pair()
    ours.setblocking(True)
    ready = fencehold.waiter(os.dup(theirs.fileno()))
    theirs.close()
    if answer:
        ours.send(answer)
    else:
        ours.shutdown(2)
    try:
        with pytest.raises(OSError):
            ready()
    finally:
        ours.close()
