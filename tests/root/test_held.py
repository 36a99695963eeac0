"""The held child (sandbox/supervisor.fork_held) with a daemon that holds
many descriptors: its pipes may sit at WORKDIR_FD, where the child puts the
workdir it opened. Needs root (the child takes the user's ids)."""

from __future__ import annotations

import os
import resource
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from leviathd.identity import UserInfo
from leviathd.sandbox import supervisor

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to take a user's ids")

NOBODY = 65534


@pytest.fixture
def work() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="leviath-held-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


@pytest.mark.parametrize("at", ["status", "go"])
def test_a_pipe_at_the_workdir_descriptor_survives_the_workdir_check(
    work: Path, at: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """Seen failing before: with 500 agents the daemon's pipes reached
    descriptor 1000 (WORKDIR_FD), the child's dup2 of the workdir replaced
    one of them, and the start failed with "the agent's process ended
    before it was ready" (status pipe) or an internal error (the go pipe:
    EPIPE on release); bench/scale.py at 500, 1-2 starts in some runs."""
    target = supervisor.WORKDIR_FD
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] <= target + 8:
        pytest.skip("the descriptor limit is too low to fill up to WORKDIR_FD")
    filler: list[int] = []
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        while True:  # every free number up to WORKDIR_FD + 1
            fd = os.dup(null)
            filler.append(fd)
            if fd >= target + 1:
                break
        # pipe2 takes the two lowest free numbers: (r, w). "status": its
        # write end (the child's) at WORKDIR_FD; "go": the go pipe's read end.
        free = [filler[-10], target] if at == "status" else [filler[-10], filler[-9], target,
                                                              target + 1]
        for fd in free:
            os.close(fd)
            filler.remove(fd)
        user = UserInfo("nobody", NOBODY, NOBODY, (NOBODY,), str(work), "/bin/sh")
        held = supervisor.fork_held(
            user, str(work), exit_path=str(work / "x.exit"), identifier="t", unit="t.scope",
            stdio=supervisor.Stdio(),
        )
    finally:
        for fd in [*filler, null]:
            os.close(fd)
    try:
        ok, detail = supervisor.read_status(held.status_r)
        assert (ok, detail) == (True, str(work))
        # The child still reads the go pipe: its end makes it leave quietly
        # (exit 1, nothing said); a go pipe it lost says EBADF.
        os.close(held.go_w)
        _, status = os.waitpid(held.pid, 0)
        assert os.waitstatus_to_exitcode(status) == 1
        assert "supervisor" not in capfd.readouterr().err
    finally:
        os.close(held.status_r)
