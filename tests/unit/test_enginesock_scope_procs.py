"""enginesock/service.py _scope_procs: an agent's engine storage is removed
only once no process is left in its scope's control groups (in any of the
hierarchies it has a folder in; a missing one holds none). Folders stand for
the cgroup hierarchies (the real file name, cgroup.procs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from leviathd.enginesock import service


def test_a_process_left_in_any_hierarchy_keeps_the_scope_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    gone, empty, busy = tmp_path / "gone", tmp_path / "empty", tmp_path / "busy"
    empty.mkdir()
    busy.mkdir()
    (empty / "cgroup.procs").write_text("")
    (busy / "cgroup.procs").write_text("4242\n")
    monkeypatch.setattr(service, "folders", lambda cgroup: [str(gone), str(empty), str(busy)])
    assert service._scope_procs("/x.scope") is True
    monkeypatch.setattr(service, "folders", lambda cgroup: [str(gone), str(empty)])
    assert service._scope_procs("/x.scope") is False
