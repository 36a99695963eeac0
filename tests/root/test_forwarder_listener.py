"""sandbox/forwarder.py take_listener: the daemon copies the proxy's
listening socket only out of an agent's PID 1 (1 in a PID namespace of its
own). A process that is not, though it holds at the same descriptor a
listener on the same address (in a network namespace of its own), gets
nothing taken from it. Needs root (namespaces, pidfd_getfd)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from leviathd.sandbox import forwarder

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces")

HOLDER = f"""
import os, socket, subprocess, sys
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.bind(({forwarder.HOST!r}, {forwarder.PORT}))
sock.listen(1)
os.dup2(sock.fileno(), {forwarder.PID1_LISTEN_FD}, inheritable=False)
print("ready", flush=True)
sys.stdin.read()
"""


def test_a_listener_held_by_a_process_that_is_no_pid_1_is_not_taken() -> None:
    # unshare(1) execs the holder in place: the Popen's pid is the holder's.
    holder = subprocess.Popen(["unshare", "-n", sys.executable, "-c", HOLDER],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "ready\n"
        taken = forwarder.take_listener(holder.pid)
        if taken is not None:
            taken.close()
        assert taken is None
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=20)
