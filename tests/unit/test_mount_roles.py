"""What a mount does in a fence is decided by its role, never by its label:
`why` is for people (`lev inspect` prints it), so rewording every label of a
spec must change nothing a credential fence keeps, a container binds or skips,
or the launcher checks before it mounts (issue 35). Each test compares the
spec as built with the same spec whose every `why` is reworded."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from test_sandbox_spec import WORKDIR, _worktree_files, spec_for

from leviathd.config.merge import Effective
from leviathd.creds.fence import credential_spec
from leviathd.domain.sandbox import SandboxKind
from leviathd.sandbox.container.settings import mount_options
from leviathd.sandbox.namespace.pinner import Pinner
from leviathd.sandbox.namespace.syscalls import FenceError
from leviathd.sandbox.spec import Mount, SandboxSpec


def reworded(spec: SandboxSpec) -> SandboxSpec:
    return replace(spec, mounts=tuple(replace(m, why=f"label {i}, reworded")
                                      for i, m in enumerate(spec.mounts)))


def table(spec: SandboxSpec) -> list[tuple[object, ...]]:
    return [(m.kind, m.target, m.source, m.readonly, m.upper, m.work, m.exact)
            for m in spec.mounts]


@pytest.mark.parametrize("mode", ["rw", "ro", "throwaway"])
@pytest.mark.parametrize("workdir", ["none", "ro"])
def test_a_credential_fence_keeps_the_same_mounts_whatever_the_labels(
    mode: str, workdir: str,
) -> None:
    spec = spec_for(files=_worktree_files(), mode=mode)
    kept = credential_spec(spec, ["git"], {}, workdir=workdir)  # type: ignore[arg-type]
    # Not vacuous: the read-only system is kept, and with workdir = "ro" the
    # workdir and the main git folder are shown.
    assert {"/usr", "/proc", "/dev"} <= {m.target for m in kept.mounts}
    if workdir == "ro":
        assert {WORKDIR, "/repos/app/.git"} <= {m.target for m in kept.mounts if m.readonly}
    again = credential_spec(reworded(spec), ["git"], {}, workdir=workdir)  # type: ignore[arg-type]
    assert table(again) == table(kept)


def test_a_container_binds_and_skips_the_same_mounts_whatever_the_labels() -> None:
    spec = spec_for(Effective(kind=SandboxKind.CONTAINER), files=_worktree_files())
    options = mount_options(spec, "podman", exists=lambda _p: True, is_dir=lambda _p: True)
    # Not vacuous: the workdir is bound, the system folders are not (the image has its own).
    assert any(WORKDIR in o for o in options) and not any("source=/usr," in o for o in options)
    assert mount_options(reworded(spec), "podman", exists=lambda _p: True,
                         is_dir=lambda _p: True) == options


def _pinned(spec: SandboxSpec, m: Mount) -> None:
    fd = Pinner(spec, -1, None).source(m)
    os.close(fd)


def _real_spec(tmp_path: Path) -> SandboxSpec:
    """The spec with the test's own ids (the launcher opens sources as the
    user) and a home inside tmp_path."""
    spec = spec_for(files=_worktree_files())
    return replace(spec, uid=os.getuid(), gid=os.getgid(), home=str(tmp_path / "home"),
                   hidden=())


@pytest.mark.parametrize("why", ["workdir", "worktree git"])
def test_the_launcher_refuses_a_workdir_holding_the_home_whatever_its_label(
    tmp_path: Path, why: str,
) -> None:
    spec = _real_spec(tmp_path)
    (tmp_path / "home").mkdir()
    m = next(m for m in spec.mounts if m.why == why)
    m = replace(m, source=str(tmp_path), target="/elsewhere")
    for label in (m.why, "reworded"):
        with pytest.raises(FenceError, match="whole home"):
            _pinned(spec, replace(m, why=label))


def test_the_launcher_checks_a_main_git_folder_whatever_its_label(tmp_path: Path) -> None:
    spec = _real_spec(tmp_path)
    m = next(m for m in spec.mounts if m.why == "worktree git")
    (tmp_path / "not-git").mkdir()
    m = replace(m, source=str(tmp_path / "not-git"))
    for label in (m.why, "reworded"):
        with pytest.raises(FenceError, match="not a git folder"):
            _pinned(spec, replace(m, why=label))
