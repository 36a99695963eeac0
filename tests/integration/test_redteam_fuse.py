"""Red team: a file of a user's own FUSE mount, sent to the daemon, must not
stop it for everyone.

Every close of a FUSE file waits, uninterruptibly, for its server's answer
to a FLUSH. alice mounts her own file system (fuse_stall.py, through the
set-uid fusermount3, /dev/fuse open to all as Debian's udev makes it) whose
server answers everyone but the daemon, opens its file and attaches it to a
bus call to leviathd, which closes what no method takes. Before the fix
that close ran on the daemon's loop: bob's `lev ps` then got no answer
until alice's server did."""

from __future__ import annotations

import queue
import subprocess
import threading
from collections.abc import Iterator

import pytest
from forged_signals import VENV_PY
from journal_wait import journal_with
from testbed import Testbed

pytestmark = pytest.mark.testbed

SERVER = "/tmp/fuse_stall.py"
SEND = r"""
import asyncio, os, sys
from dbus_fast import Message
from dbus_fast.aio import MessageBus
from dbus_fast.constants import BusType

async def main():
    fd = os.open(sys.argv[1], os.O_RDONLY)
    assert os.read(fd, 16) == b"hello\n"
    bus = await MessageBus(bus_type=BusType.SYSTEM, negotiate_unix_fd=True).connect()
    # Any call carries descriptors; the daemon closes those no method takes.
    bus.send(Message(destination="org.leviath.Manager1", path="/org/leviath/Manager1",
                     interface="org.leviath.Manager1", member="List", signature="h",
                     body=[0], unix_fds=[fd]))
    await asyncio.sleep(1)
    print("sent", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


_LINES: dict[int, queue.Queue[str]] = {}


def _line(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    """The next line `proc` prints, "" if none comes within `timeout` (the
    assertion then fails at once, not at the test's time limit). A thread
    reads its output: a select on a buffered pipe misses lines read ahead."""
    lines = _LINES.get(proc.pid)
    if lines is None:
        lines = _LINES[proc.pid] = queue.Queue()
        out = proc.stdout
        assert out is not None
        threading.Thread(target=lambda: [lines.put(line.strip()) for line in out],
                         daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return ""


@pytest.fixture
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.start_service("leviathd.service")
    # As on any Debian machine with udev (its rule makes /dev/fuse 0666).
    mode = testbed.run(["stat", "-c", "%a", "/dev/fuse"]).stdout.strip()
    testbed.run(["chmod", "0666", "/dev/fuse"])
    try:
        yield testbed
    finally:
        testbed.run(["chmod", mode, "/dev/fuse"])


def test_a_fuse_file_sent_to_the_daemon_does_not_stop_it_for_others(bed: Testbed) -> None:
    home = bed.users["alice"].home
    where = f"{home}/fz"
    bed.run(["mkdir", "-p", where], user="alice")
    with open(__file__.replace("test_redteam_fuse.py", "fuse_stall.py")) as src:
        bed.write_file(SERVER, src.read())
    bed.write_file("/tmp/fuse_send.py", SEND)
    daemon = bed.run(["systemctl", "show", "-P", "MainPID", "leviathd"]).stdout.strip()
    server = subprocess.Popen(bed.command(["python3", SERVER, where, daemon], user="alice"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sender: subprocess.Popen[str] | None = None
    try:
        assert _line(server) == "ready", "the FUSE server did not mount"
        sender = subprocess.Popen(
            bed.command([VENV_PY, "/tmp/fuse_send.py", f"{where}/f"], user="alice"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert _line(sender) == "sent", "the bus call was not sent"
        # The daemon's close reached alice's server, which holds it.
        held = _line(server)
        assert held.startswith("held "), held
        # bob is served meanwhile (before the fix: no answer, the bound ran out).
        r = bed.run(["lev", "ps"], user="bob", timeout=60, check=False)
        assert r.returncode == 0, r
        # The held close was ended by aborting alice's connection: her server
        # is told so and ends; the daemon says why.
        logged = journal_with(bed, ["-u", "leviathd", "-o", "cat"], "aborted FUSE connection")
        assert "aborted FUSE connection" in logged, logged[-2000:]
        server.wait(timeout=60)
        r = bed.run(["lev", "ps"], user="alice", timeout=60, check=False)
        assert r.returncode == 0, r
    finally:
        for proc in (sender, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        bed.run(["fusermount3", "-u", "-z", where], user="alice", check=False)
