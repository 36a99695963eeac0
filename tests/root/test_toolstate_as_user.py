"""Root makes an agent tool's missing state in a user's home
(sandbox/toolstate.create_as_user) with the user's rights and by
descriptor: `nobody` plants links where the folders would go, and root
must neither follow them nor make anything that is not nobody's own."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from leviathd.sandbox.toolstate import Missing, create_as_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root and a second user")

NOBODY = 65534


@pytest.fixture
def base() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="leviath-toolstate-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    (base / "root").mkdir(mode=0o755)  # root's, which nobody cannot write
    (base / "home").mkdir(mode=0o755)
    os.chown(base / "home", NOBODY, NOBODY)
    yield base
    shutil.rmtree(base)


def test_state_is_made_as_the_user_with_private_modes(base: Path) -> None:
    home = base / "home"
    old = os.umask(0)
    try:
        notes = create_as_user(NOBODY, NOBODY, str(home), [
            Missing("Claude Code", ".claude", True, "installed"),
            Missing("Claude Code", ".claude.json", False, "installed"),
            Missing("opencode", ".local/share/opencode", True, "installed"),
        ])
    finally:
        os.umask(old)
    assert notes == []
    for rel, mode in ((".claude", 0o700), (".claude.json", 0o600), (".local", 0o700),
                      (".local/share", 0o700), (".local/share/opencode", 0o700)):
        st = os.lstat(home / rel)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, mode), rel
    assert (home / ".claude.json").read_text() == "{}\n"


def test_a_planted_link_on_the_way_is_not_followed(base: Path) -> None:
    home = base / "home"
    elsewhere = base / "elsewhere"  # nobody's own, so only the link check stops it
    elsewhere.mkdir(mode=0o755)
    os.chown(elsewhere, NOBODY, NOBODY)
    for target in (base / "root", elsewhere):
        if os.path.lexists(home / ".config"):
            os.unlink(home / ".config")
        os.symlink(str(target), home / ".config")
        os.lchown(home / ".config", NOBODY, NOBODY)
        notes = create_as_user(NOBODY, NOBODY, str(home),
                               [Missing("opencode", ".config/opencode", True, "installed")])
        assert len(notes) == 1 and "not made" in notes[0], notes
        assert os.listdir(target) == [], target


def test_what_the_user_cannot_write_is_not_made_by_roots_rights(base: Path) -> None:
    home = base / "home"
    (home / ".local").mkdir(mode=0o755)  # root's folder in nobody's home
    notes = create_as_user(NOBODY, NOBODY, str(home),
                           [Missing("opencode", ".local/share/opencode", True, "installed")])
    assert len(notes) == 1 and "Permission denied" in notes[0], notes
    assert os.listdir(home / ".local") == []


def test_an_existing_entry_is_left_as_it_is(base: Path) -> None:
    home = base / "home"
    os.symlink("/etc/shadow", home / ".claude.json")
    notes = create_as_user(NOBODY, NOBODY, str(home),
                           [Missing("Claude Code", ".claude.json", False, "installed")])
    assert notes == []
    assert os.readlink(home / ".claude.json") == "/etc/shadow"


def test_a_home_that_is_not_the_users_is_refused(base: Path) -> None:
    notes = create_as_user(NOBODY, NOBODY, str(base / "root"),
                           [Missing("Codex", ".codex", True, "installed")])
    assert notes and "not the user's own folder" in notes[0], notes
    assert os.listdir(base / "root") == []


def test_prepare_looks_and_makes_as_the_user(base: Path) -> None:
    from leviathd.sandbox.toolstate import prepare

    home = base / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    (home / ".local" / "bin" / "codex").touch()
    for p in (home / ".local", home / ".local" / "bin", home / ".local" / "bin" / "codex"):
        os.lchown(p, NOBODY, NOBODY)
    # Root's 0700 folder holding a claude: root sees it, the user does not,
    # so it does not count as her installed tool.
    (home / ".npm-global" / "bin").mkdir(parents=True)
    (home / ".npm-global" / "bin" / "claude").touch()
    os.chmod(home / ".npm-global", 0o700)
    asked: list[int] = []
    assert prepare(NOBODY, NOBODY, str(home), [["make"]], [], lambda: asked.append(1)) == []
    assert asked == [1]
    st = os.lstat(home / ".codex")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o700)
    assert not os.path.lexists(home / ".claude") and not os.path.lexists(home / ".claude.json")
    # Nothing missing: polkit's answer is not waited for.
    assert prepare(NOBODY, NOBODY, str(home), [["make"]], [], lambda: asked.append(2)) == []
    assert asked == [1]
