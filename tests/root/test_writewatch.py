"""broker/writewatch.py against the real kernel: fanotify mount marks on the
mounts of another mount namespace (a child's, as an agent's would be),
labels set through the event's descriptor, nothing while clean, and a
flood that overflows the kernel's queue turning into a floor for later
reads instead of lost labels. Root only (fanotify groups and trusted.*)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from leviathd import fanotify
from leviathd.broker.writewatch import WriteWatch
from leviathd.policy import filelabels
from leviathd.policy.labels import Sensitivity

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify and trusted.* need root")

DIR = "/tmp/leviath-writewatch-test"


class Child:
    """A shell in a mount namespace of its own with a tmpfs at DIR: it runs
    each line it is sent and answers "ok"."""

    def __init__(self) -> None:
        os.makedirs(DIR, exist_ok=True)
        self.proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             f"mount -t tmpfs none {DIR} && echo ok && "
             "while read -r line; do eval \"$line\"; echo ok; done"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.line() == "ok"

    def line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def run(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        assert self.line() == "ok"

    def label(self, name: str) -> Sensitivity | None:
        fd = os.open(f"/proc/{self.proc.pid}/root{DIR}/{name}", os.O_RDONLY)
        try:
            return filelabels.read_label(fd)
        finally:
            os.close(fd)


@pytest.fixture
def child() -> Iterator[Child]:
    c = Child()
    yield c
    c.proc.kill()
    c.proc.wait()


def watch_of(child: Child, taint: list[Sensitivity]) -> WriteWatch:
    w = WriteWatch("test", lambda: taint[0])
    w._group = fanotify.init()
    w._mark_all(child.proc.pid)
    assert w.active
    return w


def test_a_write_while_tainted_is_labelled_one_while_clean_is_not(child: Child) -> None:
    taint = [Sensitivity.PRIVATE]
    w = watch_of(child, taint)
    try:
        child.run(f"mkdir -p {DIR}/sub && echo secret > {DIR}/sub/a && ln {DIR}/sub/a {DIR}/b")
        w.drain()
        assert child.label("sub/a") == Sensitivity.PRIVATE
        assert child.label("b") == Sensitivity.PRIVATE  # the inode's
        assert w.written == Sensitivity.PRIVATE and w.floor == Sensitivity.PUBLIC
        taint[0] = Sensitivity.INTERNAL
        w.release()
        assert not w.active
        child.run(f"echo late > {DIR}/c && echo more >> {DIR}/sub/a")
        w.drain()
        assert child.label("c") is None
        assert child.label("sub/a") == Sensitivity.PRIVATE  # only ever raised
    finally:
        w.close()


def test_the_users_own_writes_outside_the_agents_mounts_raise_nothing(child: Child) -> None:
    w = watch_of(child, [Sensitivity.PRIVATE])
    try:
        path = f"{DIR}-host"
        with open(path, "w") as f:  # the host's mount of /tmp, not the child's
            f.write("mine")
        assert w.drain() == 0
    finally:
        w.close()
        os.unlink(f"{DIR}-host")


def test_a_flood_past_the_kernels_queue_becomes_a_floor(child: Child) -> None:
    w = watch_of(child, [Sensitivity.PRIVATE])
    try:
        # More distinct files than the queue holds (16,384), none read yet.
        child.run(f"cd {DIR} && i=0; while [ $i -lt 17000 ]; do : > f$i; i=$((i+1)); done")
        handled = w.drain()
        assert handled <= 16385  # bounded by the queue, whatever the agent did
        assert w.floor == Sensitivity.PRIVATE
    finally:
        w.close()


def test_after_the_drop_opening_a_labelled_file_again_is_reported(child: Child) -> None:
    taint = [Sensitivity.PRIVATE]
    opened: list[tuple[Sensitivity, str]] = []
    w = WriteWatch("test", lambda: taint[0], on_read=lambda label, where: opened.append(
        (label, where)))
    w._group = fanotify.init()
    w._mark_all(child.proc.pid)
    try:
        child.run(f"echo secret > {DIR}/a")
        w.drain()
        taint[0] = Sensitivity.INTERNAL
        w.release()
        assert w.active  # it wrote labelled files: the marks stay
        child.run(f"echo plain > {DIR}/p")
        child.run(f"cat {DIR}/p >/dev/null && cat {DIR}/a >/dev/null")
        w.drain()
        assert opened == [(Sensitivity.PRIVATE, f"{DIR}/a")]
    finally:
        w.close()
