"""policy/filelabels.py on a real file system: the label kept with a file in
`trusted.leviath.label` and the folder's mark, from the side of an agent who
wants Private data to come out unlabelled (an edit by a clean agent, an
edit from another, a label it cannot parse) and of the user who tries to
strip the label themselves. Needs root (trusted.* needs CAP_SYS_ADMIN)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from leviathd.domain.sensitivity import Sensitivity
from leviathd.policy import filelabels

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="trusted.* needs CAP_SYS_ADMIN")

PUBLIC, INTERNAL, PRIVATE = Sensitivity.PUBLIC, Sensitivity.INTERNAL, Sensitivity.PRIVATE
NOBODY = 65534


@pytest.fixture
def work() -> Iterator[Path]:
    # /var/tmp: on disk (tmpfs may keep no trusted.* on some kernels).
    base = Path(tempfile.mkdtemp(prefix="leviath-labels-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base)


def _label_of(path: Path) -> Sensitivity | None:
    """Read as a later broker would: a new descriptor on the file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return filelabels.read_label(fd)
    finally:
        os.close(fd)


def _write(path: Path, taint: Sensitivity, *, whole: bool) -> Sensitivity | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        return filelabels.label_written(fd, taint, whole=whole)
    finally:
        os.close(fd)


def test_a_file_written_at_private_keeps_that_label(work: Path) -> None:
    assert _write(work / "f", PRIVATE, whole=True) == PRIVATE
    assert _label_of(work / "f") == PRIVATE


@pytest.mark.parametrize("taint", [PUBLIC, INTERNAL])
def test_an_edit_by_a_cleaner_agent_does_not_launder_a_private_file(
    work: Path, taint: Sensitivity
) -> None:
    # The edit keeps the rest of the Private content: the label stays.
    _write(work / "f", PRIVATE, whole=True)
    assert _write(work / "f", taint, whole=False) == PRIVATE
    assert _label_of(work / "f") == PRIVATE


def test_an_edit_at_private_of_a_clean_file_labels_it(work: Path) -> None:
    _write(work / "f", PUBLIC, whole=True)
    assert _write(work / "f", PRIVATE, whole=False) == PRIVATE
    assert _label_of(work / "f") == PRIVATE


def test_a_whole_rewrite_by_a_clean_agent_drops_the_label(work: Path) -> None:
    _write(work / "f", PRIVATE, whole=True)
    assert _write(work / "f", INTERNAL, whole=True) == INTERNAL
    assert _label_of(work / "f") is None


def test_a_label_nobody_can_parse_reads_as_private(work: Path) -> None:
    (work / "f").write_text("")
    os.setxattr(work / "f", filelabels.FILE_LABEL, b"\xffsecret-ish")
    assert _label_of(work / "f") == PRIVATE
    assert _write(work / "f", PUBLIC, whole=False) == PRIVATE


def test_the_user_can_neither_strip_nor_lower_the_label(work: Path) -> None:
    _write(work / "f", PRIVATE, whole=True)
    os.chown(work / "f", NOBODY, NOBODY)
    tried = subprocess.run(
        [sys.executable, "-I", "-c",
         "import os, sys\n"
         f"p = {str(work / 'f')!r}\n"
         "for act in (lambda: os.removexattr(p, 'trusted.leviath.label'),\n"
         "            lambda: os.setxattr(p, 'trusted.leviath.label', b'public')):\n"
         "    try:\n        act()\n        sys.exit('changed')\n"
         "    except PermissionError:\n        pass\n"],
        user=NOBODY, group=NOBODY, extra_groups=[], capture_output=True, text=True, timeout=30)
    assert tried.returncode == 0, tried.stderr
    assert _label_of(work / "f") == PRIVATE


def test_the_folders_mark_only_goes_up(work: Path) -> None:
    fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert filelabels.dir_mark(fd) is None
        filelabels.raise_dir_mark(fd, INTERNAL)
        assert filelabels.dir_mark(fd) == INTERNAL
        filelabels.raise_dir_mark(fd, PRIVATE)
        filelabels.raise_dir_mark(fd, PUBLIC)
        filelabels.raise_dir_mark(fd, INTERNAL)
        assert filelabels.dir_mark(fd) == PRIVATE
    finally:
        os.close(fd)


@pytest.mark.parametrize("tool", ["read_file", "read_files"])
def test_a_brokered_read_carries_the_label_kept_with_the_file(work: Path, tool: str) -> None:
    """Issue 47: read_file reads with the open that resolves it (read_ahead),
    read_files with the run's own open; both label the read with what the
    file keeps, whichever open read it."""
    from unit.broker_harness import call, running_broker

    from leviathd.policy.settings import PolicySettings

    (work / "home").mkdir()
    (work / "w").mkdir()
    _write(work / "w" / "kept.txt", PRIVATE, whole=True)
    (work / "w" / "kept.txt").write_text("secret-ish\n")
    settings = PolicySettings(permissions={"read_file": "allow", "read_files": "allow"})
    with running_broker(home=str(work / "home"), workdir=str(work / "w"), settings=settings,
                        socket_path=str(work / "b.sock")) as b:
        args = {"path": "kept.txt"} if tool == "read_file" else {"paths": ["kept.txt"]}
        reply = call(b.path, tool, args)
    assert reply["ok"], reply
    assert "secret-ish" in str(reply["result"])
    assert reply["label"] == "private" and reply["taint"] == "private", reply
