"""Root copies a user's ~/.claude.json for an agent and merges the copy back
(sandbox/claudestate.py) with the user's rights and by descriptor: `nobody`
plants links where the files and folders are, or a copy too large, and root
must neither follow them, nor read past the bound, nor write anything that
is not nobody's own."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from leviathd.sandbox import claudestate

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root and a second user")

NOBODY = 65534
AGENT = "0123abcd"
WORK = "/srv/work"


@pytest.fixture
def home() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="leviath-claudestate-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    home = base / "home"
    home.mkdir(mode=0o755)
    os.chown(home, NOBODY, NOBODY)
    (base / "secret").write_text('{"numStartups": 99, "root": "secret"}')
    os.chmod(base / "secret", 0o600)
    yield home
    shutil.rmtree(base)


def _as_nobody(path: Path, text: str, mode: int = 0o600) -> None:
    path.write_text(text)
    os.chmod(path, mode)
    os.chown(path, NOBODY, NOBODY)


def test_the_copy_and_the_merge_are_the_users(home: Path) -> None:
    _as_nobody(home / ".claude.json", json.dumps({"numStartups": 1, "mcpServers": {}}), 0o640)
    assert claudestate.make_copy(NOBODY, NOBODY, str(home), AGENT) is None
    copy = Path(claudestate.copy_path(str(home), AGENT))
    st = os.lstat(copy)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o600)
    for rel in (".local", ".local/state", ".local/state/leviath", ".local/state/leviath/claude"):
        st = os.lstat(home / rel)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o700), rel
    copy.write_text(json.dumps({"numStartups": 7, "mcpServers": {"evil": {"command": "sh"}}}))
    lines: list[str] = []
    claudestate.merge_back(NOBODY, NOBODY, str(home), AGENT, WORK, lines.append)
    st = os.lstat(home / ".claude.json")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (NOBODY, 0o640)
    assert json.loads((home / ".claude.json").read_text()) == {"numStartups": 7,
                                                                "mcpServers": {}}
    assert not copy.exists()
    assert len(lines) == 1 and "mcpServers" in lines[0], lines


def test_links_are_not_followed(home: Path) -> None:
    secret = home.parent / "secret"
    os.symlink(secret, home / ".claude.json")
    os.lchown(home / ".claude.json", NOBODY, NOBODY)
    note = claudestate.make_copy(NOBODY, NOBODY, str(home), AGENT)
    assert note is not None and "no copy made" in note
    assert not os.path.lexists(claudestate.copy_path(str(home), AGENT))
    # A copy planted as a link to root's file, and a host file that is a link:
    # nothing read through them, nothing written.
    copies = Path(claudestate.copy_path(str(home), AGENT)).parent
    copies.mkdir(parents=True)
    for p in (copies, *list(copies.parents)[:3]):
        os.chown(p, NOBODY, NOBODY)
    os.symlink(secret, copies / f"{AGENT}.json")
    lines: list[str] = []
    claudestate.merge_back(NOBODY, NOBODY, str(home), AGENT, WORK, lines.append)
    assert os.path.islink(home / ".claude.json")
    assert json.loads(secret.read_text()) == {"numStartups": 99, "root": "secret"}
    assert len(lines) == 1 and "not merged back" in lines[0], lines
    # The folder of the copies as a link: not entered.
    os.unlink(copies / f"{AGENT}.json")
    os.rmdir(copies)
    os.symlink(home.parent, copies)
    lines.clear()
    claudestate.merge_back(NOBODY, NOBODY, str(home), AGENT, WORK, lines.append)
    assert lines == []  # (nothing there to merge, as if no copy was made)


def test_a_copy_past_the_bound_is_not_read(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claudestate, "MAX_SIZE", 64)
    _as_nobody(home / ".claude.json", '{"numStartups": 1}')
    assert claudestate.make_copy(NOBODY, NOBODY, str(home), AGENT) is None
    copy = Path(claudestate.copy_path(str(home), AGENT))
    copy.write_text(json.dumps({"numStartups": 5, "pad": "x" * 100}))
    lines: list[str] = []
    claudestate.merge_back(NOBODY, NOBODY, str(home), AGENT, WORK, lines.append)
    assert json.loads((home / ".claude.json").read_text()) == {"numStartups": 1}
    assert len(lines) == 1 and "larger than" in lines[0], lines
