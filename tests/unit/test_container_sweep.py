"""sandbox/container/cleanup.py sweep: at start, the identity folders of
agents that are no longer alive go; a live agent's stay. No engine here (none
present: only the runtime folder is swept), so the engine calls are not run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from leviathd.sandbox.container import cleanup
from leviathd.sandbox.container.settings import _IDENTITY_FILES


def test_sweep_removes_the_dead_agents_identity_and_keeps_the_live_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cleanup, "runtime_dir", lambda: str(tmp_path))
    monkeypatch.setattr(cleanup, "_present_engines", lambda: [])
    unpinned: list[str] = []
    monkeypatch.setattr(cleanup, "unpin", unpinned.append)
    containers = tmp_path / "containers"
    for agent in ("live0001", "dead0002"):
        (containers / agent).mkdir(parents=True)
        for name in _IDENTITY_FILES:
            (containers / agent / name).write_text("x")
    (containers / "pinned" / "live0001").mkdir(parents=True)
    (containers / "pinned" / "dead0002").mkdir(parents=True)

    assert asyncio.run(cleanup.sweep(["live0001"])) == []

    assert not (containers / "dead0002").exists()
    assert sorted(p.name for p in (containers / "live0001").iterdir()) == sorted(_IDENTITY_FILES)
    assert unpinned == ["dead0002"]
