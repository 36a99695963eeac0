"""Issue 50: the scratch's mkfs.ext4 is run by root only when it is root's
and nobody else may replace it (sandbox/loopfs.py `_trusted`). A program
planted where the daemon looks, owned by a user or writable by a group or
by all, is never taken: the scratch falls back to tmpfs (`backing()`), it
is not run as root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from leviathd.sandbox import loopfs


def _program(tmp_path: Path, mode: int, uid: int = 0) -> str:
    path = tmp_path / "mkfs.ext4"
    path.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(path, mode)
    if os.geteuid() == 0:
        os.chown(path, uid, uid)
    return str(path)


def _candidates(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    monkeypatch.setattr(loopfs, "MKFS_CANDIDATES", (path,))


def test_roots_program_that_only_root_may_write_is_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a root-owned file")
    path = _program(tmp_path, 0o755)
    _candidates(monkeypatch, path)
    assert loopfs.mkfs_path() == path


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777], ids=["group", "world", "both"])
def test_a_program_others_may_write_is_never_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int) -> None:
    _candidates(monkeypatch, _program(tmp_path, mode))
    assert loopfs.mkfs_path() is None
    assert loopfs.backing() == "tmpfs"


def test_a_users_program_is_never_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As root: a file given to uid 65534; as a user, every file made is hers.
    _candidates(monkeypatch, _program(tmp_path, 0o755, uid=65534))
    assert loopfs.mkfs_path() is None


def test_a_folder_or_a_link_to_a_users_program_is_never_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dir").mkdir(mode=0o755)
    _candidates(monkeypatch, str(tmp_path / "dir"))
    assert loopfs.mkfs_path() is None
    users = _program(tmp_path, 0o755, uid=65534)
    os.symlink(users, tmp_path / "link")
    _candidates(monkeypatch, str(tmp_path / "link"))
    assert loopfs.mkfs_path() is None

