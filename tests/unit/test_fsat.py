"""leviathd.fsat: descriptor-relative file operations never follow a link."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from leviathd import fsat


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    v.write_text("secret")
    v.chmod(0o640)
    return v


def test_open_dir_refuses_a_symlink_others_could_have_made(tmp_path: Path) -> None:
    (tmp_path / "real" / "sub").mkdir(parents=True)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: anyone may put a link here
    (shared / "link").symlink_to(tmp_path / "real")
    fd = fsat.open_dir(str(tmp_path / "real" / "sub"))
    os.close(fd)
    with pytest.raises(OSError):
        fsat.open_dir(str(shared / "link" / "sub"))
    fd = fsat.open_dir(str(tmp_path / "new" / "a"), create_mode=0o700)
    os.close(fd)
    assert stat.S_IMODE((tmp_path / "new" / "a").stat().st_mode) == 0o700


def test_open_dir_follows_a_link_only_root_or_the_caller_could_make(tmp_path: Path) -> None:
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "own").symlink_to("real")  # like /var/run -> ../run
    (tmp_path / "up").symlink_to("real/../real/sub")
    for path in (tmp_path / "own" / "sub", tmp_path / "up"):
        fd = fsat.open_dir(str(path))
        try:
            assert os.fstat(fd).st_ino == (tmp_path / "real" / "sub").stat().st_ino
        finally:
            os.close(fd)
    if os.geteuid() == 0:
        os.chown(tmp_path / "own", 65534, 65534, follow_symlinks=False)
        with pytest.raises(OSError):
            fsat.open_dir(str(tmp_path / "own" / "sub"))


def test_chmod_chown_open_unlink_never_follow(tmp_path: Path, victim: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "x").symlink_to(victim)
    fd = fsat.open_dir(str(d))
    try:
        with pytest.raises(OSError):
            fsat.chmod_at(fd, "x", 0o777)
        with pytest.raises(OSError):
            fsat.open_at(fd, "x", os.O_RDONLY)
        fsat.chown_at(fd, "x", os.getuid(), os.getgid())
        fsat.unlink_at(fd, "x")
        with pytest.raises(ValueError):
            fsat.unlink_at(fd, "../victim")
    finally:
        os.close(fd)
    assert victim.read_text() == "secret" and stat.S_IMODE(victim.stat().st_mode) == 0o640


def test_atomic_write_replaces_a_symlink_not_its_target(tmp_path: Path, victim: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "f").symlink_to(victim)
    fd = fsat.open_dir(str(d))
    try:
        fsat.atomic_write_at(fd, "f", b"new", mode=0o644)
        assert fsat.read_at(fd, "f") == b"new"
    finally:
        os.close(fd)
    assert not (d / "f").is_symlink() and stat.S_IMODE((d / "f").stat().st_mode) == 0o644
    assert victim.read_text() == "secret"
    assert os.listdir(d) == ["f"]


def test_remove_tree_at_removes_links_not_targets_and_deep_trees(
    tmp_path: Path, victim: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("k")
    t = tmp_path / "t"
    deep = t
    for i in range(300):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    (t / "dirlink").symlink_to(outside)
    (t / "filelink").symlink_to(victim)
    (t / "d0" / "fifo").parent.mkdir(exist_ok=True)
    os.mkfifo(t / "d0" / "fifo")
    fd = fsat.open_dir(str(tmp_path))
    try:
        fsat.remove_tree_at(fd, "t")
        fsat.remove_tree_at(fd, "t")  # missing: fine
    finally:
        os.close(fd)
    assert not t.exists()
    assert (outside / "keep").read_text() == "k" and victim.read_text() == "secret"


def test_bind_unix_at_has_its_mode_from_the_start(tmp_path: Path) -> None:
    d = tmp_path / "s"
    d.mkdir(mode=0o755)
    fd = fsat.open_dir(str(d))
    try:
        (d / "sock").symlink_to(tmp_path / "elsewhere")
        sock = fsat.bind_unix_at(fd, "sock", mode=0o600, uid=os.getuid(), gid=os.getgid())
        sock.close()
    finally:
        os.close(fd)
    st = os.lstat(d / "sock")
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert not (tmp_path / "elsewhere").exists()


def test_subdir_at_makes_or_opens_a_folder_but_never_a_planted_link(
    tmp_path: Path, victim: Path
) -> None:
    top = fsat.open_dir(str(tmp_path))
    try:
        fd = fsat.subdir_at(top, "made", 0o711)
        os.close(fd)
        assert stat.S_IMODE((tmp_path / "made").stat().st_mode) == 0o711 & ~_umask()
        fd = fsat.subdir_at(top, "made", 0o700)  # there already: opened as it is
        os.close(fd)
        (tmp_path / "planted").symlink_to(victim.parent)
        with pytest.raises(OSError):
            fsat.subdir_at(top, "planted")
    finally:
        os.close(top)


def test_unlink_path_removes_the_name_not_what_a_link_on_the_way_points_to(
    tmp_path: Path, victim: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "victim").write_text("keep")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: anyone may put a link here
    (shared / "via").symlink_to(elsewhere)
    with pytest.raises(OSError):
        fsat.unlink_path(str(shared / "via" / "victim"))
    assert (elsewhere / "victim").read_text() == "keep"
    fsat.unlink_path(str(victim))
    assert not victim.exists()
    fsat.unlink_path(str(victim))  # already gone: missing_ok


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old
