"""sandbox/pinned.py: a folder pinned by a descriptor, bound at a root-only
path for a container engine, is the folder the user opened, whatever the
user does to its path afterwards. Needs root (mounts, in a private mount
namespace of a forked child)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from leviathd.errors import Unavailable
from leviathd.sandbox import pinned

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount")


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="leviath-pinned-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    (path / "proj").mkdir()
    (path / "proj" / "mine").write_text("project")
    (path / "secret").mkdir()
    (path / "secret" / "key").write_text("root's")
    yield path
    shutil.rmtree(path)


def _private(fn: Callable[[], object]) -> Any:
    """`fn` in a forked child with a private mount namespace; its answer as JSON."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            assert libc.unshare(0x00020000) == 0
            assert libc.mount(None, b"/", None, 16384 | (1 << 18), None) == 0
            out: object = {"ok": fn()}
        except BaseException as exc:
            out = {"err": f"{type(exc).__name__}: {exc}"}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = json.loads(f.read())
    os.waitpid(pid, 0)
    return data


def test_the_bound_folder_stays_the_pinned_one_when_its_path_becomes_a_link(base: Path) -> None:
    proj, pins = str(base / "proj"), str(base / "pins" / "a1")

    def run() -> object:
        fd = os.open(proj, os.O_PATH | os.O_DIRECTORY)
        path = pinned.bind_pinned(f"/proc/self/fd/{fd}", pins, "workdir", expect=proj)
        # The user swaps the path for a link to something only root may read.
        os.rename(proj, proj + ".away")
        os.symlink(str(base / "secret"), proj)
        seen = sorted(os.listdir(path))
        os.unlink(proj)
        os.rename(proj + ".away", proj)
        pinned.release(pins)
        return {"seen": seen, "left": os.path.exists(pins)}

    assert _private(run) == {"ok": {"seen": ["mine"], "left": False}}


def test_a_pinned_folder_that_is_no_longer_the_checked_path_is_refused(base: Path) -> None:
    proj, pins = str(base / "proj"), str(base / "pins" / "a2")

    def run() -> object:
        fd = os.open(proj, os.O_PATH | os.O_DIRECTORY)
        os.rename(proj, proj + ".away")
        try:
            pinned.bind_pinned(f"/proc/self/fd/{fd}", pins, "workdir", expect=proj)
        except Unavailable as exc:
            return str(exc)
        finally:
            os.rename(proj + ".away", proj)
        return "bound"

    assert "not " + proj in _private(run)["ok"]
