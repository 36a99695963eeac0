"""leviathd.fsat as the root daemon uses it, with `nobody` as the user who
owns the folder and plants things in it: root's chown/open/bind there must
never reach what a planted link points to or hand anything to the wrong
owner. Needs root (files of two users, a mount)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from leviathd import fsat

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root and a second user")

NOBODY = 65534


@pytest.fixture
def world() -> Iterator[Path]:
    """A folder everyone can traverse, holding root's secret and nobody's home."""
    base = Path(tempfile.mkdtemp(prefix="leviath-fsat-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    (base / "secret").write_text("root only")
    os.chmod(base / "secret", 0o600)
    (base / "home").mkdir(mode=0o755)
    os.chown(base / "home", NOBODY, NOBODY)
    yield base
    shutil.rmtree(base)


def as_nobody(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-I", "-c", code], user=NOBODY, group=NOBODY,
                          extra_groups=[], capture_output=True, text=True, timeout=30)


def test_chown_at_for_the_user_gives_them_their_planted_link_not_its_target(
    world: Path,
) -> None:
    # Root hands the user a file in their folder; they replaced it by a link
    # to a root-only file, hoping root's chown follows it.
    home = world / "home"
    planted = as_nobody(f"import os; os.symlink({str(world / 'secret')!r}, {str(home / 'f')!r})")
    assert planted.returncode == 0, planted.stderr
    fd = fsat.open_dir(str(home))
    try:
        fsat.chown_at(fd, "f", NOBODY, NOBODY)
    finally:
        os.close(fd)
    assert (world / "secret").stat().st_uid == 0
    assert os.lstat(home / "f").st_uid == NOBODY
    assert as_nobody(f"open({str(home / 'f')!r}).read()").returncode != 0


def test_open_dir_does_not_follow_a_root_made_link_the_user_moved_into_their_folder(
    world: Path,
) -> None:
    # The link is root's (made for them elsewhere in their tree), but the
    # folder it sits in is the user's: they chose which link is there.
    (world / "etc" / "sub").mkdir(parents=True)
    home = world / "home"
    (home / "given").mkdir()
    os.chown(home / "given", NOBODY, NOBODY)
    os.symlink(world / "etc", home / "given" / "link")  # root's link
    moved = as_nobody(f"import os; os.rename({str(home / 'given' / 'link')!r}, "
                      f"{str(home / 'cfg')!r})")
    assert moved.returncode == 0, moved.stderr
    assert os.lstat(home / "cfg").st_uid == 0
    with pytest.raises(OSError) as refused:
        fsat.open_dir(str(home / "cfg" / "sub"))
    assert refused.value.errno in (errno.ELOOP, errno.ENOTDIR)


@pytest.mark.parametrize("owner, mode", [(NOBODY, 0o755), (0, 0o775), (0, 0o757)])
def test_bind_unix_at_refuses_a_folder_someone_else_can_write(
    world: Path, owner: int, mode: int
) -> None:
    # Between bind and chown the folder's other writers could swap the socket
    # for their own (clients then talk to them) or for a link.
    folder = world / "sockets"
    folder.mkdir()
    os.chown(folder, owner, owner)
    os.chmod(folder, mode)
    fd = fsat.open_dir(str(folder))
    try:
        with pytest.raises(PermissionError):
            fsat.bind_unix_at(fd, "s", mode=0o600, uid=NOBODY, gid=NOBODY)
    finally:
        os.close(fd)
    assert not (folder / "s").exists()


@pytest.mark.parametrize("uid, gid, mode", [
    (NOBODY, NOBODY, 0o600), (NOBODY, None, 0o600), (None, NOBODY, 0o660),
])
def test_bind_unix_at_gives_the_socket_to_whom_it_is_for(
    world: Path, uid: int | None, gid: int | None, mode: int
) -> None:
    folder = world / "sockets"
    folder.mkdir(mode=0o755)
    fd = fsat.open_dir(str(folder))
    try:
        sock = fsat.bind_unix_at(fd, "s", mode=mode, uid=uid, gid=gid)
    finally:
        os.close(fd)
    try:
        sock.listen(1)
        st = os.lstat(folder / "s")
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == mode
        assert (st.st_uid, st.st_gid) == (uid if uid is not None else 0,
                                          gid if gid is not None else 0)
        # The user it is for can connect (the daemon's answer to them).
        conn = as_nobody("import socket; s = socket.socket(socket.AF_UNIX); "
                         f"s.connect({str(folder / 's')!r})")
        assert conn.returncode == 0, conn.stderr
    finally:
        sock.close()


def test_remove_tree_at_leaves_a_mount_inside_the_tree_alone(world: Path) -> None:
    # A folder on another file system inside the tree (a bind mount the
    # user's agent was given, say) is not entered: its files are not root's
    # to remove as part of the user's tree.
    t = world / "home" / "t"
    (t / "mnt").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "none", str(t / "mnt")], check=True)
    try:
        (t / "mnt" / "keep").write_text("k")
        (t / "f").write_text("x")
        fd = fsat.open_dir(str(world / "home"))
        try:
            with pytest.raises(OSError) as left:
                fsat.remove_tree_at(fd, "t")
        finally:
            os.close(fd)
        assert left.value.errno == errno.EXDEV
        assert (t / "mnt" / "keep").read_text() == "k" and not (t / "f").exists()
    finally:
        subprocess.run(["umount", str(t / "mnt")], check=True)
