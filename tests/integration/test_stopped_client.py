"""An attached `lev run` that is stopped (SIGSTOP) with a full pipe as its
output must not stall its agent (issue 17 §8): the agent's output reaches the
journal whole, the agent ends, and `lev logs` shows all of it."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from quiescent import daemon_pid, settled
from testbed import Testbed

pytestmark = pytest.mark.testbed

CONFIG = """
[sandbox]
kind = "namespace"
"""
# 1,000,000 x's in lines of 999 (under journald's rate limit in lines), once
# the client is stopped (the daemon copies this in about a second: it would
# be over before the test saw it running).
AGENT = "sleep 4; head -c 1000000 /dev/zero | tr '\\\\0' x | fold -w 999; echo; echo STALLTEST-DONE"


@pytest.fixture
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.run(["mkdir", "-p", "stall-work"], user="alice")
    yield testbed


def test_a_stopped_attached_client_does_not_stall_the_journal(bed: Testbed) -> None:
    work = f"{bed.users['alice'].home}/stall-work"
    bed.run(["rm", "-f", "levpid"], user="alice", cwd=work)
    # lev run's output is a pipe that nobody reads (sleep), and lev itself is
    # stopped once it runs.
    shell = f"( lev run -- sh -c \"{AGENT}\" & echo $! > levpid; wait ) | sleep 120"
    client = subprocess.Popen(bed.command(["sh", "-c", shell], user="alice", cwd=work),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    agent = ""
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not agent:
            time.sleep(0.2)
            rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="alice",
                                      cwd=work).stdout)
            mine = [r for r in rows if "STALLTEST-DONE" in " ".join(r.get("command", []))
                    and r["state"] == "running"]
            if mine:
                agent = mine[0]["id"]
        assert agent, "the agent did not start"
        # Once it runs, its client stops (the pipe behind it is not read either).
        bed.run(["kill", "-STOP", bed.read_file(f"{work}/levpid").strip()], user="alice")
        # The agent ends although nobody reads its terminal.
        state = "running"
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="alice",
                                      cwd=work).stdout)
            state = next(r["state"] for r in rows if r["id"] == agent)
            if state != "running":
                break
            time.sleep(0.5)
        assert state == "exited", f"agent {agent} still {state}: its output stalled"
        logs = bed.run(["lev", "logs", agent], user="alice", cwd=work, timeout=60).stdout
        assert logs.count("x") == 1000000, logs.count("x")
        assert "STALLTEST-DONE" in logs
    finally:
        pid = bed.run(["cat", f"{work}/levpid"], check=False).stdout.strip()
        if pid:
            bed.run(["kill", "-CONT", pid], check=False)
            bed.run(["kill", pid], check=False)
        client.kill()
        client.wait()
        if agent:
            bed.run(["lev", "stop", agent], user="alice", cwd=work, check=False)


# A client of its own (as alice): RunAttached with pipes it made and never
# reads (their read ends stay open, so the daemon's writes would block), the
# agent flooding output; or with a named FIFO and a regular file, which the
# daemon does not copy to (they get a supervisor, as before).
HOSTILE = r"""
import os, sys, time
from leviathd.cli.wire import SyncClient, Variant
kind, work = sys.argv[1], sys.argv[2]
if kind == "pipes":
    (r1, w1), (r2, w2) = os.pipe(), os.pipe()
    out, err = w1, w2
else:
    os.mkfifo(work + "/fifo")
    reader = os.open(work + "/fifo", os.O_RDONLY | os.O_NONBLOCK)
    out = os.open(work + "/fifo", os.O_WRONLY)
    err = os.open(work + "/file", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
c = SyncClient()
req = {"workdir": Variant("s", work), "env": Variant("a{ss}", {"PATH": "/usr/bin:/bin"}),
       "workdir_mode": Variant("s", "rw"), "command": Variant("as", ["sh", "-c", sys.argv[3]])}
agent_id, _unit = c.call("RunAttached", "a{sv}hhh", [req, 0, 1, 2], unix_fds=[0, out, err])
print(agent_id, flush=True)
time.sleep(120)
"""
VENV_PYTHON = "/opt/leviath-dev/venv/bin/python"
FLOOD = "head -c 20000000 /dev/zero | tr '\\0' z | fold -w 40000; echo FLOOD-DONE"


def _rss_kib(bed: Testbed) -> int:
    pid = bed.run(["systemctl", "show", "-P", "MainPID", "leviathd"]).stdout.strip()
    status = bed.run(["cat", f"/proc/{pid}/status"]).stdout
    return next(int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmRSS:"))


def _quiet_rss_kib(bed: Testbed) -> int:
    """The base the growth is measured from: at a quiescent point."""
    return settled(bed, daemon_pid(bed), "rss_kib")


@pytest.mark.parametrize("kind", ["pipes", "odd"])
def test_a_client_that_never_reads_costs_the_daemon_nothing_unbounded(
    bed: Testbed, kind: str,
) -> None:
    """20 MB of output to a client that never reads: the agent ends, the
    daemon's memory grows by a bounded amount (its per-agent buffers), and
    the daemon answers meanwhile. With odd descriptors (a FIFO, a file) the
    agent runs with a supervisor, as before."""
    work = f"{bed.users['alice'].home}/stall-work"
    bed.run(["rm", "-f", f"{work}/fifo", f"{work}/file", f"{work}/hostile.py"], user="alice")
    bed.run(f"cat > {work}/hostile.py", user="alice", input=HOSTILE)
    before = _quiet_rss_kib(bed)
    client = subprocess.Popen(
        bed.command([VENV_PYTHON, f"{work}/hostile.py", kind, work, FLOOD], user="alice",
                    cwd=work),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    agent = ""
    try:
        assert client.stdout is not None
        agent = client.stdout.readline().decode().strip()
        assert agent, client.stderr.read().decode() if client.stderr else ""
        deadline = time.monotonic() + 90
        state = "running"
        peak = before
        while time.monotonic() < deadline and state == "running":
            peak = max(peak, _rss_kib(bed))
            rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="alice").stdout)
            state = next(r["state"] for r in rows if r["id"] == agent)
            time.sleep(0.3)
        assert state == "exited", f"agent {agent} still {state}"
        assert peak - before < 16 * 1024, (before, peak)
    finally:
        client.kill()
        client.wait()
        if agent:
            bed.run(["lev", "stop", agent], user="alice", check=False)
