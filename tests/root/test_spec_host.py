"""The daemon reads a user's own files (a workdir's `.git`, the git folder it
names, `.gitconfig`) with the user's file-system ids, not root's. Needs root."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from leviathd.sandbox.spec import host_read_text_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch fsuid")

NOBODY = 65534


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="leviath-spec-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


def test_a_file_only_root_may_read_is_not_read_for_a_user(tmp_path: Path) -> None:
    secret = tmp_path / "commondir"
    secret.write_text("root's\n")
    os.chmod(secret, 0o600)
    mine = tmp_path / "gitdir"
    mine.write_text("mine\n")
    os.chown(mine, NOBODY, NOBODY)
    os.chmod(mine, 0o600)
    read = host_read_text_as(NOBODY, NOBODY)
    assert read(str(secret)) is None
    assert read(str(mine)) == "mine\n"
    # The thread's ids are root's again afterwards.
    assert host_read_text_as(0, 0)(str(secret)) == "root's\n"
    assert open(secret).read() == "root's\n"  # noqa: SIM115
    seen: list[str | None] = []
    t = threading.Thread(target=lambda: seen.append(read(str(secret))))
    t.start()
    t.join()
    assert seen == [None]
