"""The held child closes every descriptor of the daemon's but those it keeps
(the bus socket above all must not live on in an agent's process), in
ranges: checked with a real fork, the kept ones at the edges and with
gaps between them."""

from __future__ import annotations

import json
import os

import pytest

from leviathd.sandbox import supervisor


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.mark.parametrize("keep_first", [True, False])
def test_only_the_kept_descriptors_stay_open_in_a_forked_child(keep_first: bool) -> None:
    r, w = os.pipe()
    opened = [os.open(os.devnull, os.O_RDONLY) for _ in range(6)]
    kept = {w, opened[1], opened[2], opened[5]} | ({0, 1, 2} if keep_first else {1, 2})
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                supervisor._close_fds_except(kept)
                left = [fd for fd in range(max(kept) + 64) if _is_open(fd)]
                os.write(w, json.dumps(sorted(left)).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        got = os.read(r, 65536)
        _, status = os.waitpid(pid, 0)
    finally:
        for fd in opened:
            os.close(fd)
        os.close(r)
    assert os.waitstatus_to_exitcode(status) == 0
    assert json.loads(got) == sorted(kept)
