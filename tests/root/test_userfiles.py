"""leviathd.userfiles.read_user_file: root reading a file in a user's home
(their config), with `nobody` as the user who plants links, hard links,
FIFOs and oversized files there. What they may get is what they could read
themselves; the daemon must neither hang nor tell them about root's files.
Needs root (files of two users)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from leviathd.userfiles import read_user_file

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root and a second user")

NOBODY = 65534


@pytest.fixture
def home() -> Iterator[Path]:
    """nobody's folder, next to root's 0700 folder holding a secret."""
    base = Path(tempfile.mkdtemp(prefix="leviath-userfiles-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    (base / "root").mkdir(mode=0o700)
    (base / "root" / "secret").write_text("root only")
    os.chmod(base / "root" / "secret", 0o600)
    (base / "home").mkdir(mode=0o755)
    os.chown(base / "home", NOBODY, NOBODY)
    yield base / "home"
    shutil.rmtree(base)


def as_nobody(code: str) -> None:
    subprocess.run([sys.executable, "-I", "-c", code], user=NOBODY, group=NOBODY,
                   extra_groups=[], check=True, timeout=30)


def test_the_users_own_file_is_read(home: Path) -> None:
    as_nobody(f"open({str(home / 'c')!r}, 'wb').write(b'a = 1\\n\\xff')")
    assert read_user_file(str(home / "c"), NOBODY, NOBODY) == "a = 1\n\ufffd"
    assert read_user_file(str(home / "missing"), NOBODY, NOBODY) is None


def test_a_link_to_a_root_file_is_refused(home: Path) -> None:
    as_nobody(f"import os; os.symlink('../root/secret', {str(home / 'c')!r})")
    with pytest.raises(PermissionError) as refused:
        read_user_file(str(home / "c"), NOBODY, NOBODY)
    assert "root only" not in str(refused.value)


def test_a_link_tells_nothing_of_what_exists_in_roots_folders(home: Path) -> None:
    # Followed, a link into a folder the user cannot search would answer
    # "not owned by you" for a file there and "no file" for a missing one.
    as_nobody(f"import os; os.symlink('../root/secret', {str(home / 'there')!r}); "
              f"os.symlink('../root/nothing', {str(home / 'absent')!r})")
    answers = []
    for name in ("there", "absent"):
        try:
            answers.append(read_user_file(str(home / name), NOBODY, NOBODY))
        except PermissionError:
            answers.append("refused")
    assert answers == ["refused", "refused"]


def test_a_hard_link_to_a_root_file_is_refused(home: Path) -> None:
    # Made by the test: protected_hardlinks stops the user here, not on
    # every system.
    os.link(home.parent / "root" / "secret", home / "c")
    with pytest.raises(PermissionError) as refused:
        read_user_file(str(home / "c"), NOBODY, NOBODY)
    assert "root only" not in str(refused.value)


@pytest.mark.parametrize("uid", [0, NOBODY - 1])
def test_a_file_of_someone_else_in_the_users_folder_is_refused(home: Path, uid: int) -> None:
    (home / "c").write_text("theirs")
    os.chown(home / "c", uid, uid)
    with pytest.raises(PermissionError, match="not owned"):
        read_user_file(str(home / "c"), NOBODY, NOBODY)


def test_a_fifo_neither_hangs_the_daemon_nor_reads_as_a_file(home: Path) -> None:
    as_nobody(f"import os; os.mkfifo({str(home / 'c')!r})")
    outcome: list[BaseException | str | None] = []

    def read() -> None:
        try:
            outcome.append(read_user_file(str(home / "c"), NOBODY, NOBODY))
        except BaseException as exc:  # judged below
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    hung = reader.is_alive()
    if hung:  # release it: a writer lets the blocked open return
        os.close(os.open(home / "c", os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert not hung, "read_user_file blocked on a FIFO"
    assert isinstance(outcome[0], PermissionError), outcome


def test_a_folder_in_place_of_the_file_is_refused(home: Path) -> None:
    as_nobody(f"import os; os.mkdir({str(home / 'c')!r})")
    with pytest.raises(PermissionError, match="not a regular file"):
        read_user_file(str(home / "c"), NOBODY, NOBODY)


def test_a_file_over_the_limit_is_refused_one_at_it_is_read(home: Path) -> None:
    as_nobody(f"open({str(home / 'big')!r}, 'w').write('x' * 101); "
              f"open({str(home / 'fits')!r}, 'w').write('x' * 100)")
    with pytest.raises(PermissionError, match="larger"):
        read_user_file(str(home / "big"), NOBODY, NOBODY, limit=100)
    assert read_user_file(str(home / "fits"), NOBODY, NOBODY, limit=100) == "x" * 100


def test_no_answer_leaves_a_descriptor_open_in_the_daemon(home: Path) -> None:
    # A user asking again and again must not use up root's descriptors.
    as_nobody(f"import os; open({str(home / 'ok')!r}, 'w').write('a'); "
              f"os.mkdir({str(home / 'dir')!r})")
    os.link(home.parent / "root" / "secret", home / "theirs")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        for name in ("ok", "dir", "theirs"):
            try:
                read_user_file(str(home / name), NOBODY, NOBODY)
            except PermissionError:
                pass
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_link_on_the_way_tells_nothing_of_what_exists_in_roots_folders(home: Path) -> None:
    # A link earlier on the way (~/.config/leviath -> P, the daemon reading
    # ~/.config/leviath/config.toml) followed with root's rights answered
    # ENOTDIR (refused) for a file at P and "no file" (None) for a missing P:
    # the user learnt which paths exist in folders they cannot search.
    as_nobody(f"import os; os.symlink('../root/secret', {str(home / 'there')!r}); "
              f"os.symlink('../root/nothing', {str(home / 'absent')!r})")
    answers = []
    for name in ("there", "absent"):
        try:
            answers.append(read_user_file(str(home / name / "config.toml"), NOBODY, NOBODY))
        except PermissionError:
            answers.append("refused")
    assert answers[0] == answers[1]


def test_the_daemon_is_root_again_after_a_read(home: Path) -> None:
    # The file-system ids are switched to the user's for the open only: what
    # root makes next (records, sockets) must not be the user's.
    as_nobody(f"open({str(home / 'c')!r}, 'w').write('a')")
    for name in ("c", "missing"):
        read_user_file(str(home / name), NOBODY, NOBODY)
        made = home.parent / f"made-{name}"
        made.write_text("")
        assert (made.stat().st_uid, made.stat().st_gid) == (0, 0)
