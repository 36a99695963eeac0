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
