"""Issue 50: the shell tool enters an agent's fence only at a process that
meets every fact of sandbox/join.py's `find_pid1`: the anchor or its child,
PID 1 of a PID namespace of its own, in the agent's scope, in a mount
namespace other than the daemon's. Real processes made here (as root, with
util-linux's unshare) stand for an agent's fence; each lacks one fact."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from leviathd.domain.sandbox import SandboxKind
from leviathd.errors import Unavailable
from leviathd.sandbox import join

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to unshare namespaces")


def _scope_word(pid: int) -> str:
    """A path component of the process's control group (what join reads as
    the agent's scope)."""
    for line in join._read(f"/proc/{pid}/cgroup").splitlines():
        words = [w for w in line.split(":", 2)[-1].split("/") if w]
        if words:
            return words[-1]
    pytest.skip("this process's control group has no name to match")


def _started(argv: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(argv)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _child(pid: int) -> int:
    """The anchor's child once it exists (unshare forks it at once), bounded."""
    deadline = time.monotonic() + 10
    while not (kids := join._children(pid)):
        assert time.monotonic() < deadline, "unshare made no child"
        time.sleep(0.01)
    return kids[0]


@pytest.fixture
def fence() -> Iterator[int]:
    """An anchor (unshare) whose child is PID 1 of new PID and mount
    namespaces: the shape of an agent's fence."""
    yield from (p.pid for p in _started(
        ["unshare", "--pid", "--mount", "--fork", "--", "sleep", "60"]))


def _nspid_one(pid: int) -> bool:
    child = _child(pid)
    deadline = time.monotonic() + 10
    while join._status(child).get("NSpid", "").split()[-1:] != ["1"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return True


def test_the_fence_is_found_at_the_anchors_child(fence: int) -> None:
    assert _nspid_one(fence)
    pidfd = join.find_pid1(fence, _scope_word(fence))
    os.close(pidfd)


def test_a_fence_in_another_scope_is_never_entered(fence: int) -> None:
    assert _nspid_one(fence)
    with pytest.raises(Unavailable):
        join.find_pid1(fence, "leviath-bob-other-0123abcd.scope")


def test_a_process_that_is_no_pid_namespaces_pid_1_is_never_entered() -> None:
    # A mount namespace of its own, but the host's PID namespace.
    for proc in _started(["unshare", "--mount", "--", "sleep", "60"]):
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{proc.pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(Unavailable):
            join.find_pid1(proc.pid, _scope_word(proc.pid))


def test_a_sandbox_of_another_kind_is_never_joined() -> None:
    spec = SimpleNamespace(kind=SandboxKind.CONTAINER, argv=("true",))
    with pytest.raises(Unavailable, match="cannot join"):
        join.run(spec, anchor=os.getpid(), unit="x.scope")  # type: ignore[arg-type]
