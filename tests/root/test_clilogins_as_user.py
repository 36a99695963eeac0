"""Root reads the agent CLIs' logins in a user's home (creds/clilogins.py)
with the user's rights and by descriptor: `nobody` plants links where the
login files and folders are, and root must not read through them."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from leviathd.proxy import loginfiles as clilogins

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root and a second user")

NOBODY = 65534
SECRET = "sk-ant-oat01-" + "s" * 60


@pytest.fixture
def home() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="leviath-clilogins-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    home = base / "home"
    (base / "rootonly").mkdir(mode=0o755)
    (base / "rootonly" / "auth.json").write_text(json.dumps({"OPENAI_API_KEY": "sk-ROOT" * 8}))
    (base / "nobodys").mkdir(mode=0o755)
    (base / "nobodys" / "auth.json").write_text(json.dumps({"OPENAI_API_KEY": "sk-ELSE" * 8}))
    os.chown(base / "nobodys", NOBODY, NOBODY)
    os.chown(base / "nobodys" / "auth.json", NOBODY, NOBODY)
    for rel in ("", ".claude"):
        (home / rel).mkdir(mode=0o700)
        os.chown(home / rel, NOBODY, NOBODY)
    yield home
    shutil.rmtree(base)


def test_logins_are_read_as_the_user_and_never_through_a_link(home: Path) -> None:
    creds = home / ".claude" / ".credentials.json"
    creds.write_text(json.dumps({"claudeAiOauth": {"accessToken": SECRET}}))
    os.chmod(creds, 0o600)
    os.chown(creds, NOBODY, NOBODY)
    # Codex's folder a link to nobody's own folder elsewhere; Gemini's login
    # file a link to root's file: neither is read.
    os.symlink(home.parent / "nobodys", home / ".codex")
    (home / ".gemini").mkdir()
    os.chown(home / ".gemini", NOBODY, NOBODY)
    os.symlink(home.parent / "rootonly" / "auth.json", home / ".gemini" / "oauth_creds.json")
    logins, notes = clilogins.read_logins(NOBODY, NOBODY, str(home))
    assert [x.tool for x in logins] == ["Claude Code"]
    assert list(logins[0].real.values()) == [SECRET]
    assert SECRET not in logins[0].placeholder.decode()
    assert len(notes) == 2, notes
    assert all("ROOT" not in n and "ELSE" not in n for n in notes)


def test_a_file_the_user_cannot_read_is_not_read(home: Path) -> None:
    creds = home / ".claude" / ".credentials.json"
    creds.write_text(json.dumps({"claudeAiOauth": {"accessToken": SECRET}}))
    os.chmod(creds, 0o600)  # root's own file in her folder: she cannot read it
    logins, notes = clilogins.read_logins(NOBODY, NOBODY, str(home))
    assert logins == [] and len(notes) == 1 and "ermission" in notes[0], notes


def test_new_tokens_are_written_whole_as_the_user_and_never_through_a_link(
        home: Path) -> None:
    """proxy/refresh.py's write-back: a new file renamed over the old one
    (never half written), hers, its mode and other keys kept, nothing left
    beside it; a link in the file's place, a file of root's, or one she made
    read-only is not written."""
    creds = home / ".claude" / ".credentials.json"
    creds.write_text(json.dumps({"claudeAiOauth": {"accessToken": SECRET, "refreshToken": "r",
                                                   "subscriptionType": "max"}, "other": 1}))
    os.chmod(creds, 0o600)
    os.chown(creds, NOBODY, NOBODY)
    inode = creds.stat().st_ino
    new = "sk-ant-oat01-" + "n" * 60
    clilogins.write_values(NOBODY, NOBODY, str(home), (".claude", ".credentials.json"),
                           {("claudeAiOauth", "accessToken"): new,
                            ("claudeAiOauth", "expiresAt"): 5})
    assert json.loads(creds.read_text()) == {"claudeAiOauth": {
        "accessToken": new, "refreshToken": "r", "subscriptionType": "max", "expiresAt": 5},
        "other": 1}
    st = creds.stat()
    assert (st.st_mode & 0o777, st.st_uid) == (0o600, NOBODY) and st.st_ino != inode
    assert sorted(p.name for p in creds.parent.iterdir()) == [".credentials.json"]
    values = {("claudeAiOauth", "accessToken"): "x"}
    # She made it read-only: root's rights would write it anyway.
    os.chmod(creds, 0o400)
    with pytest.raises(PermissionError):
        clilogins.write_values(NOBODY, NOBODY, str(home), (".claude", ".credentials.json"),
                               values)
    # A link to root's file in its place; root's own file there.
    creds.unlink()
    os.symlink(home.parent / "rootonly" / "auth.json", creds)
    with pytest.raises(OSError):
        clilogins.write_values(NOBODY, NOBODY, str(home), (".claude", ".credentials.json"),
                               values)
    creds.unlink()
    creds.write_text(json.dumps({"claudeAiOauth": {"accessToken": SECRET}}))
    os.chmod(creds, 0o666)
    with pytest.raises(ValueError):
        clilogins.write_values(NOBODY, NOBODY, str(home), (".claude", ".credentials.json"),
                               values)
    assert "ROOT" in (home.parent / "rootonly" / "auth.json").read_text()
    assert json.loads(creds.read_text())["claudeAiOauth"]["accessToken"] == SECRET
