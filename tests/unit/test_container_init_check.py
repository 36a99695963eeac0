"""Issue 50: the worker execs into a container only while its PID 1 is the
process recorded at its start, running as the container's init user, in the
namespaces it started in (sandbox/container/records.py `check_init`). A
real process (as root: started as the init's uid) stands for that PID 1."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Iterator

import pytest

from leviathd.errors import Unavailable
from leviathd.sandbox.container import records
from leviathd.sandbox.container.settings import INIT_UID

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start another uid")


def _init(uid: int) -> Iterator[records.Record]:
    proc = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                             "sleep", "60"])
    try:
        # setpriv execs sleep: the pid is the same; its uid is set at once.
        start, namespaces, _uids = records.init_state(proc.pid)
        yield records.Record(engine=None, init_pid=proc.pid, init_start=start,  # type: ignore[arg-type]
                             namespaces=namespaces)
    finally:
        proc.kill()
        proc.wait()


def _uids_settled(pid: int, uid: int) -> None:
    import time

    deadline = time.monotonic() + 10
    while records.init_state(pid)[2] != (uid,) * 4:
        assert time.monotonic() < deadline, "setpriv never changed its uid"
        time.sleep(0.01)


def test_the_recorded_init_passes() -> None:
    for rec in _init(INIT_UID):
        _uids_settled(rec.init_pid, INIT_UID)
        records.check_init(dataclasses.replace(rec, init_start=records.init_state(rec.init_pid)[0]))


def test_an_init_that_runs_as_another_uid_is_refused() -> None:
    for rec in _init(1234):
        _uids_settled(rec.init_pid, 1234)
        with pytest.raises(Unavailable, match="not the process it started with"):
            records.check_init(rec)


def test_another_process_under_the_recorded_pid_is_refused() -> None:
    for rec in _init(INIT_UID):
        _uids_settled(rec.init_pid, INIT_UID)
        with pytest.raises(Unavailable, match="not the process it started with"):
            records.check_init(dataclasses.replace(rec, init_start="1"))


def test_an_init_in_other_namespaces_is_refused() -> None:
    for rec in _init(INIT_UID):
        _uids_settled(rec.init_pid, INIT_UID)
        moved = {**rec.namespaces, "mnt": "mnt:[1]"}
        with pytest.raises(Unavailable, match="left the namespaces"):
            records.check_init(dataclasses.replace(rec, namespaces=moved))
