"""agents/output.py's choice of what the daemon writes to itself: only the
write end of an anonymous pipe, opened again so that O_NONBLOCK is the
daemon's alone (the caller's shell may share the original)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from leviathd.agents import output


def test_a_pipe_is_opened_again_non_blocking_and_the_callers_stays_blocking() -> None:
    r, w = os.pipe()
    try:
        mine = output.private_pipe(w)
        assert mine is not None and mine >= 0
        try:
            assert not os.get_blocking(mine)
            assert os.get_blocking(w)  # the caller's file description is untouched
            os.write(mine, b"x")
            assert os.read(r, 1) == b"x"
            # A full pipe: the daemon's write fails at once instead of waiting.
            fcntl.fcntl(r, 1031, 4096)  # F_SETPIPE_SZ
            try:
                while True:
                    os.write(mine, b"y" * 4096)
            except BlockingIOError:
                pass
        finally:
            os.close(mine)
    finally:
        os.close(r)
        os.close(w)


def test_anything_but_a_pipes_write_end_is_left_to_a_supervisor(tmp_path: Path) -> None:
    r, w = os.pipe()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(fifo, os.O_WRONLY)
    plain = os.open(tmp_path / "file", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert output.private_pipe(r) is None  # a read end
        assert output.private_pipe(writer) is None  # a named FIFO
        assert output.private_pipe(plain) is None  # a file
        assert output.private_pipe(9999) is None  # nothing
    finally:
        for fd in (r, w, reader, writer, plain):
            os.close(fd)


def test_a_pipe_nobody_reads_fails_the_daemons_writes_at_once() -> None:
    r, w = os.pipe()
    os.close(r)
    mine = output.private_pipe(w)
    try:
        assert mine is not None
        if mine >= 0:  # -1: nothing to write to at all
            try:
                os.write(mine, b"x")
                raise AssertionError("wrote to a pipe nobody reads")
            except BrokenPipeError:
                pass
    finally:
        os.close(w)
        if mine is not None and mine >= 0:
            os.close(mine)


def test_the_budget_is_a_share_of_the_file_limit() -> None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert 1 <= output.budget() * 6 <= max(soft // 8, 6)
