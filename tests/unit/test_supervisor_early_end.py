"""The held child's look at PID 1 right after its start (supervisor.
ended_at_start), with real processes: a command that ended before the look
keeps the status its shell recorded; only a PID 1 killed before its shell
ran gets a record from us. Seen failing before the fix: a fast `sh -c
"exit 5"` was recorded as 0 (the shell's own status, printf's), one start
in 25 in the test bed after a busy test."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from leviathd.sandbox.supervisor import ended_at_start


def _gone(pid: int) -> None:
    # A zombie, not reaped: as PID 1 is when the held child looks.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return
        time.sleep(0.01)
    raise AssertionError("the child never ended")


def test_a_command_that_ended_first_keeps_the_status_its_shell_recorded(tmp_path: Path) -> None:
    spare, exit_path = tmp_path / "spare", tmp_path / "agent.exit"
    with open(spare, "w") as record:
        # As PID 1's script does, with the record as its stdout.
        shell = subprocess.Popen(
            ["dash", "-c", '(exec "$@"); s=$?; printf \'{"exit_status": %d}\\n\' "$s"',
             "leviath", "sh", "-c", "exit 5"],
            stdout=record,
        )
    _gone(shell.pid)
    assert ended_at_start(shell.pid, str(exit_path)) == 0  # the shell's own status
    assert not exit_path.exists(), exit_path.read_text()
    assert json.loads(spare.read_text())["exit_status"] == 5


def test_a_pid1_killed_before_its_shell_ran_is_recorded_by_us(tmp_path: Path) -> None:
    exit_path = tmp_path / "agent.exit"
    proc = subprocess.Popen(["sleep", "60"])
    proc.send_signal(signal.SIGTERM)
    _gone(proc.pid)
    assert ended_at_start(proc.pid, str(exit_path)) == 128 + signal.SIGTERM
    assert json.loads(exit_path.read_text())["exit_status"] == 128 + signal.SIGTERM


def test_a_running_pid1_is_left_alone(tmp_path: Path) -> None:
    exit_path = tmp_path / "agent.exit"
    proc = subprocess.Popen(["sleep", "60"])
    try:
        assert ended_at_start(proc.pid, str(exit_path)) is None
        assert not exit_path.exists()
    finally:
        proc.kill()
        proc.wait()
