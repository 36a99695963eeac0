"""Scratch folders: private to their agent, removed without following an
agent's links, swept only when their execution is not running. Needs root
(the folders are handed to another uid)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from leviathd.config.merge import Effective
from leviathd.config.models import SandboxKind
from leviathd.errors import Unavailable
from leviathd.identity import UserInfo
from leviathd.sandbox import scratch
from leviathd.sandbox.spec import RunRequest, SandboxSpec, build_spec

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand folders to a user")

NOBODY = 65534


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="leviath-scratch-", dir="/var/tmp"))
    os.chmod(path, 0o755)
    (path / "work").mkdir()
    yield path
    shutil.rmtree(path)


def _spec(base: Path, execution: str, mode: str = "rw") -> SandboxSpec:
    user = UserInfo("nobody", NOBODY, NOBODY, (NOBODY,), str(base / "home"), "/bin/sh")
    return build_spec(
        Effective(kind=SandboxKind.NAMESPACE, scratch_dir=str(base / "scratch")),
        user,
        RunRequest(("true",), str(base / "work"), mode),  # type: ignore[arg-type]
        execution,
        existing=lambda p: p in (str(base / "work"), "/usr", "/etc"),
    )


def test_a_scratch_folder_is_the_users_alone_under_a_root_owned_parent(base: Path) -> None:
    spec = _spec(base, "aaaa0001")
    scratch.create(spec)
    parent = os.stat(base / "scratch")
    assert parent.st_uid == 0 and stat.S_IMODE(parent.st_mode) == 0o711
    for path in (spec.scratch, spec.scratch_home, spec.scratch_tmp):
        st = os.stat(path)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, 0o700), path


def test_a_throwaway_layer_is_made_in_scratch_with_the_workdirs_owner(base: Path) -> None:
    os.chown(base / "work", NOBODY, NOBODY)
    spec = _spec(base, "aaaa0002", mode="throwaway")
    scratch.create(spec)
    (overlay,) = [m for m in spec.mounts if m.kind == "overlay"]
    assert os.stat(overlay.upper).st_uid == NOBODY
    assert os.path.isdir(overlay.work)


def test_removal_does_not_follow_links_an_agent_planted(base: Path) -> None:
    spec = _spec(base, "aaaa0003")
    scratch.create(spec)
    victim = base / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    os.symlink(victim, Path(spec.scratch_home) / "link-to-victim")
    os.symlink(victim / "keep", Path(spec.scratch_tmp) / "file-link")
    assert scratch.remove(spec.scratch)
    assert not os.path.lexists(spec.scratch)
    assert (victim / "keep").read_text() == "precious"


def test_a_scratch_folder_replaced_by_a_link_is_unlinked_not_followed(base: Path) -> None:
    spec = _spec(base, "aaaa0004")
    scratch.create(spec)
    shutil.rmtree(spec.scratch)
    target = base / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    os.symlink(target, spec.scratch)
    assert scratch.remove(spec.scratch)
    assert (target / "keep").exists()


def test_sweep_removes_ended_executions_and_never_touches_running_ones(base: Path) -> None:
    running, ended = _spec(base, "aaaa0005"), _spec(base, "aaaa0006")
    scratch.create(running)
    scratch.create(ended)
    (base / "scratch" / "not an id!").mkdir()
    assert scratch.sweep(str(base / "scratch"), live={"aaaa0005"}) == ["aaaa0006"]
    assert os.path.isdir(running.scratch)
    assert not os.path.exists(ended.scratch)
    assert (base / "scratch" / "not an id!").is_dir()


def test_creating_over_another_users_folder_is_refused(base: Path) -> None:
    spec = _spec(base, "aaaa0007")
    (base / "scratch").mkdir(mode=0o711)
    os.mkdir(spec.scratch, 0o700)  # root's, not nobody's
    with pytest.raises(Unavailable, match="not this agent's"):
        scratch.create(spec)
