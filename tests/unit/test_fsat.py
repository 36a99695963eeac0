"""leviathd.fsat: descriptor-relative file operations never follow a link."""

from __future__ import annotations

import errno
import os
import resource
import secrets
import stat
import threading
from collections.abc import Callable
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


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "x\0"])
def test_no_helper_takes_a_name_that_is_not_one_entry(tmp_path: Path, name: str) -> None:
    # chmod_at(fd, "..", 0o777) would open the folder holding the user's one
    # (their home's parent, say) to everyone; chown_at(fd, "..") would give
    # it to them. Every helper refuses such a name before any system call.
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    tmp_path.chmod(0o755)
    fd = fsat.open_dir(str(d))
    try:
        calls: list[Callable[[], object]] = [
            lambda: fsat.chmod_at(fd, name, 0o777),
            lambda: fsat.chown_at(fd, name, os.getuid(), os.getgid()),
            lambda: fsat.open_at(fd, name, os.O_RDONLY),
            lambda: fsat.open_dir_at(fd, name),
            lambda: fsat.lstat_at(fd, name),
            lambda: fsat.unlink_at(fd, name),
            lambda: fsat.rmdir_at(fd, name),
            lambda: fsat.mkdir_at(fd, name, exist_ok=True),
            lambda: fsat.rename_at(fd, name, fd, "dst"),
        ]
        for call in calls:
            with pytest.raises(ValueError):
                call()
    finally:
        os.close(fd)
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o775, 0o757])
def test_open_dir_refuses_a_link_in_a_folder_its_group_or_others_can_write(
    tmp_path: Path, mode: int
) -> None:
    # The link is the caller's own, but anyone in the folder's group (or
    # anyone at all) could have replaced it by one of theirs: not followed.
    (tmp_path / "real" / "sub").mkdir(parents=True)
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(mode)
    (folder / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OSError) as refused:
        fsat.open_dir(str(folder / "link" / "sub"))
    assert refused.value.errno in (errno.ELOOP, errno.ENOTDIR)


def test_open_dir_through_a_file_is_not_a_folder(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        fsat.open_dir(str(tmp_path / "f" / "sub"))


def test_a_link_gone_before_it_is_judged_is_not_trusted(tmp_path: Path) -> None:
    # open_dir asks _trusted_link after an open failed with ELOOP/ENOTDIR; a
    # user who removes the entry in between must meet the open's OSError, not
    # a crash on the missing entry.
    fd = fsat.open_dir(str(tmp_path))
    try:
        assert fsat._trusted_link(fd, "gone") is None
    finally:
        os.close(fd)


def test_chmod_at_refuses_a_planted_link_itself(tmp_path: Path, victim: Path) -> None:
    # (The kernel also refuses a mode change through the link on this path;
    # the helper says ELOOP before asking it.)
    (tmp_path / "x").symlink_to(victim)
    fd = fsat.open_dir(str(tmp_path))
    try:
        with pytest.raises(OSError) as refused:
            fsat.chmod_at(fd, "x", 0o777)
    finally:
        os.close(fd)
    assert refused.value.errno == errno.ELOOP
    assert stat.S_IMODE(victim.stat().st_mode) == 0o640


def test_read_at_of_a_planted_fifo_returns_at_once_with_an_error(tmp_path: Path) -> None:
    # A user puts a FIFO where root reads a file: with no writer, a blocking
    # open would hang the daemon's thread for good.
    os.mkfifo(tmp_path / "config")
    fd = fsat.open_dir(str(tmp_path))
    outcome: list[BaseException | bytes] = []

    def read() -> None:
        try:
            outcome.append(fsat.read_at(fd, "config"))
        except BaseException as exc:  # judged below
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    hung = reader.is_alive()
    if hung:  # release it: a writer lets the blocked open return
        os.close(os.open(tmp_path / "config", os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    os.close(fd)
    assert not hung, "read_at blocked on a FIFO"
    assert isinstance(outcome[0], OSError) and outcome[0].errno == errno.EINVAL


def test_atomic_write_never_writes_into_a_file_planted_at_its_temp_name(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The temp name is random; a user who could guess it plants a hard link
    # to a file root must not write (made here by the test, as the kernel's
    # protected_hardlinks stops users on this host) or a FIFO there.
    monkeypatch.setattr(secrets, "token_hex", lambda n: "0" * (2 * n))
    d = tmp_path / "d"
    d.mkdir()
    os.link(victim, d / f".f.{'0' * 12}.tmp")
    fd = fsat.open_dir(str(d))
    try:
        with pytest.raises(FileExistsError):
            fsat.atomic_write_at(fd, "f", b"new", mode=0o644)
    finally:
        os.close(fd)
    assert victim.read_text() == "secret" and stat.S_IMODE(victim.stat().st_mode) == 0o640
    assert not (d / "f").exists()


def test_atomic_write_temp_file_is_private_before_its_mode_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Between the create and the fchmod a reader could open the temp file and
    # keep reading it once the data is in, whatever mode comes later.
    seen: list[int] = []
    real = fsat.set_owner_mode

    def spy(fd: int, uid: int | None, gid: int | None, mode: int | None) -> None:
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        real(fd, uid, gid, mode)

    monkeypatch.setattr(fsat, "set_owner_mode", spy)
    old = os.umask(0o022)  # systemd's default for services
    dfd = fsat.open_dir(str(tmp_path))
    try:
        fsat.atomic_write_at(dfd, "f", b"secret", mode=0o600)
    finally:
        os.close(dfd)
        os.umask(old)
    assert seen and seen[0] & 0o077 == 0, oct(seen[0])


def _tree(top: Path, files: int) -> None:
    top.mkdir()
    for i in range(files):
        (top / f"f{i}").write_text("")


def test_remove_tree_at_gives_up_on_a_folder_that_outgrows_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A user refilling a folder while root empties it must not keep the
    # daemon busy forever: past _MAX_REMOVALS entries it stops (EAGAIN).
    monkeypatch.setattr(fsat, "_MAX_REMOVALS", 5)
    _tree(tmp_path / "fits", 5)
    _tree(tmp_path / "over", 6)
    fd = fsat.open_dir(str(tmp_path))
    try:
        fsat.remove_tree_at(fd, "fits")
        with pytest.raises(OSError) as stopped:
            fsat.remove_tree_at(fd, "over")
    finally:
        os.close(fd)
    assert stopped.value.errno == errno.EAGAIN
    assert not (tmp_path / "fits").exists() and (tmp_path / "over").is_dir()


def test_remove_tree_at_of_a_deep_tree_holds_a_bounded_number_of_descriptors(
    tmp_path: Path,
) -> None:
    # A user's tree deeper than the daemon's descriptor limit must not make
    # root run out of descriptors (EMFILE) while removing it.
    deep = tmp_path / "t"
    for i in range(200):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    in_use = len(os.listdir("/proc/self/fd"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fd = fsat.open_dir(str(tmp_path))
    resource.setrlimit(resource.RLIMIT_NOFILE, (in_use + 100, hard))
    try:
        fsat.remove_tree_at(fd, "t")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        os.close(fd)
    assert not (tmp_path / "t").exists()


def test_remove_tree_at_stops_when_the_folder_is_swapped_before_it_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The user renames another folder (one root keeps there) over the one
    # root is about to empty, between root's lstat and its open.
    (tmp_path / "t").mkdir()
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "state").write_text("root's")
    real = fsat.open_dir_at

    def swap_then_open(dir_fd: int, name: str) -> int:
        if name == "t":
            os.rename(tmp_path / "kept", tmp_path / "t")
        return real(dir_fd, name)

    monkeypatch.setattr(fsat, "open_dir_at", swap_then_open)
    fd = fsat.open_dir(str(tmp_path))
    try:
        with pytest.raises(OSError) as stopped:
            fsat.remove_tree_at(fd, "t")
    finally:
        os.close(fd)
    assert stopped.value.errno == errno.EAGAIN
    assert (tmp_path / "t" / "state").read_text() == "root's"
