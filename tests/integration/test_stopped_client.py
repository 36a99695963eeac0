"""An attached `lev run` that is stopped (SIGSTOP) with a full pipe as its
output must not stall its agent (issue 17 §8): the agent's output reaches the
journal whole, the agent ends, and `lev logs` shows all of it."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
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
