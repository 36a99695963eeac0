"""leviathd/inotify.py against the kernel: a watched folder reports a file
written there and one renamed into it, by name (what config/watch.py acts on)."""

from __future__ import annotations

import os
import select
from pathlib import Path

from leviathd import inotify


def _events(fd: int) -> list[inotify.Event]:
    assert select.select([fd], [], [], 10)[0], "no event within 10 s"
    return inotify.read(fd)


def test_a_write_and_a_rename_into_the_folder_are_reported(tmp_path: Path) -> None:
    fd = inotify.init()
    try:
        inotify.add_watch(fd, str(tmp_path), inotify.IN_CLOSE_WRITE | inotify.IN_MOVED_TO)
        assert inotify.read(fd) == []  # non-blocking
        (tmp_path / "config.toml").write_text("a")
        got = _events(fd)
        assert [(e.name, bool(e.mask & inotify.IN_CLOSE_WRITE)) for e in got] == [
            ("config.toml", True)]
        (tmp_path / ".tmp").write_text("b")
        _events(fd)
        os.rename(tmp_path / ".tmp", tmp_path / "config.toml")
        got = _events(fd)
        assert any(e.name == "config.toml" and e.mask & inotify.IN_MOVED_TO for e in got), got
    finally:
        os.close(fd)


def test_a_truncated_event_is_dropped() -> None:
    import struct

    whole = struct.pack("=iIII", 1, inotify.IN_CREATE, 0, 8) + b"abc\0\0\0\0\0"
    assert [e.name for e in inotify.parse(whole + whole[:10])] == ["abc"]


def test_a_missing_folder_raises() -> None:
    fd = inotify.init()
    try:
        try:
            inotify.add_watch(fd, "/nonexistent-leviath", inotify.IN_CREATE)
        except FileNotFoundError:
            pass
        else:
            raise AssertionError("no error for a missing folder")
    finally:
        os.close(fd)
