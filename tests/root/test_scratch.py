"""Scratch: a root-owned empty mount point on disk, a bounded tmpfs in the
agent's own mount namespace, removed without following an agent's links,
swept only when its execution is not running. Needs root."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from leviathd.config.merge import Effective
from leviathd.config.models import SandboxKind
from leviathd.errors import Unavailable
from leviathd.identity import UserInfo
from leviathd.sandbox import loopfs, scratch
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


def test_a_scratch_folder_is_an_empty_root_owned_mount_point(base: Path) -> None:
    spec = _spec(base, "aaaa0001")
    scratch.create(spec)
    parent = os.stat(base / "scratch")
    assert parent.st_uid == 0 and stat.S_IMODE(parent.st_mode) == 0o711
    st = os.stat(spec.scratch)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700)
    assert os.listdir(spec.scratch) == []


def _in_child(fn: Callable[[], object]) -> Any:
    """Run `fn` in a forked child (it may change its namespaces); its answer
    comes back as JSON."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
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


def test_the_tmpfs_is_seen_only_in_the_agents_namespace_and_is_bounded(base: Path) -> None:
    spec = dataclasses.replace(_spec(base, "aaaa0002", mode="throwaway"), scratch_size=1 << 20)

    def inside() -> object:
        scratch.enter(spec)
        owners = {}
        for rel in ("home", "tmp", "overlay/0/upper", "overlay/0/work"):
            st = os.stat(os.path.join(spec.scratch, rel))
            owners[rel] = [st.st_uid, stat.S_IMODE(st.st_mode)]
        try:
            with open(os.path.join(spec.scratch_home, "big"), "wb") as f:
                f.write(b"x" * (2 << 20))
            full = "no error"
        except OSError as exc:
            full = errno.errorcode[exc.errno or 0]
        return {"owners": owners, "full": full}

    got = _in_child(inside)["ok"]
    assert got["owners"] == {
        "home": [NOBODY, 0o700], "tmp": [NOBODY, 0o700],
        "overlay/0/upper": [0, 0o700], "overlay/0/work": [0, 0o700],
    }  # fmt: skip
    assert got["full"] == "ENOSPC"
    # The host's view: the empty mount point, nothing of the agent's.
    assert os.listdir(spec.scratch) == []


def _loop_backing(device: str) -> str:
    try:
        with open(f"/sys/dev/block/{device}/loop/backing_file", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


@pytest.mark.skipif(loopfs.backing() != "ext4", reason="no loop devices or mkfs.ext4 here")
def test_the_ext4_scratch_is_bounded_on_disk_and_goes_with_its_namespace(base: Path) -> None:
    spec = dataclasses.replace(_spec(base, "aaaa0012", mode="throwaway"), scratch_size=16 << 20,
                               scratch_fs="ext4")  # fmt: skip

    def inside() -> object:
        scratch.enter(spec)
        root = os.stat(spec.scratch)
        st = os.statvfs(spec.scratch)
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mine = [ln.split() for ln in f if ln.split()[4] == spec.scratch]
        try:
            with open(os.path.join(spec.scratch_tmp, "big"), "wb") as f:
                f.write(b"x" * (32 << 20))
            full = "no error"
        except OSError as exc:
            full = errno.errorcode[exc.errno or 0]
        device = mine[0][2]
        return {"root": [root.st_uid, stat.S_IMODE(root.st_mode)],
                "entries": sorted(os.listdir(spec.scratch)), "fstype": mine[0][-3],
                "bytes": st.f_blocks * st.f_frsize, "full": full, "device": device,
                "backing": _loop_backing(device)}  # fmt: skip

    got = _in_child(inside)["ok"]
    assert got["fstype"] == "ext4" and got["root"] == [0, 0o700]
    # No lost+found: what is there is root's folders and the user's two.
    assert got["entries"] == ["home", "overlay", "tmp"]
    assert got["bytes"] <= 16 << 20 and got["full"] == "ENOSPC"
    # On disk in the scratch folder, but under no name.
    assert got["backing"].endswith(" (deleted)") and "/#" in got["backing"]
    assert os.listdir(base / "scratch") == ["aaaa0012"]
    assert os.listdir(spec.scratch) == []
    # The child's namespace, the only holder of the mount, is gone: so is
    # the device's hold on the file (autoclear), waited for, not timed.
    for _ in range(200):
        if _loop_backing(got["device"]) != got["backing"]:
            break
        time.sleep(0.05)
    assert _loop_backing(got["device"]) != got["backing"]


def test_removal_does_not_follow_links_an_agent_planted(base: Path) -> None:
    # The on-disk layout older versions left: the user's folders with the agent's links.
    spec = _spec(base, "aaaa0003")
    scratch.create(spec)
    victim = base / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    for name in ("home", "tmp"):
        os.mkdir(os.path.join(spec.scratch, name))
    os.symlink(victim, Path(spec.scratch_home) / "link-to-victim")
    os.symlink(victim / "keep", Path(spec.scratch_tmp) / "file-link")
    assert scratch.remove(spec.scratch)
    assert not os.path.lexists(spec.scratch)
    assert (victim / "keep").read_text() == "precious"


def test_a_scratch_folder_replaced_by_a_link_is_unlinked_not_followed(base: Path) -> None:
    spec = _spec(base, "aaaa0004")
    scratch.create(spec)
    os.rmdir(spec.scratch)
    target = base / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    os.symlink(target, spec.scratch)
    assert scratch.remove(spec.scratch)
    assert (target / "keep").exists() and not os.path.lexists(spec.scratch)


def test_sweep_removes_ended_executions_and_never_touches_running_ones(base: Path) -> None:
    running, ended = _spec(base, "aaaa0005"), _spec(base, "aaaa0006")
    scratch.create(running)
    scratch.create(ended)
    (base / "scratch" / "not an id!").mkdir()
    # An image file a crash left named (a filesystem without O_TMPFILE).
    (base / "scratch" / f"{loopfs.IMAGE_PREFIX}0123456789abcdef").write_bytes(b"")
    assert scratch.sweep(str(base / "scratch"), live={"aaaa0005"}) == ["aaaa0006"]
    assert os.path.isdir(running.scratch)
    assert not os.path.exists(ended.scratch)
    assert (base / "scratch" / "not an id!").is_dir()
    assert sorted(os.listdir(base / "scratch")) == ["aaaa0005", "not an id!"]


def test_creating_over_a_folder_that_is_not_roots_alone_is_refused(base: Path) -> None:
    spec = _spec(base, "aaaa0007")
    (base / "scratch").mkdir(mode=0o711)
    os.mkdir(spec.scratch, 0o700)
    os.chown(spec.scratch, NOBODY, NOBODY)
    with pytest.raises(Unavailable, match="not root's"):
        scratch.create(spec)


def test_a_scratch_dir_below_a_users_folder_is_refused(base: Path) -> None:
    os.chown(base, NOBODY, NOBODY)
    with pytest.raises(Unavailable, match="not root's alone"):
        scratch.create(_spec(base, "aaaa0008"))


@pytest.mark.skipif(loopfs.backing() != "ext4", reason="no loop devices or mkfs.ext4 here")
def test_a_scratch_size_too_small_for_an_ext4_gets_the_smallest_one(base: Path) -> None:
    spec = dataclasses.replace(_spec(base, "aaaa0013"), scratch_size=64 << 10, scratch_fs="ext4")

    def inside() -> object:
        scratch.enter(spec)
        st = os.statvfs(spec.scratch)
        return st.f_blocks * st.f_frsize

    got = _in_child(inside)
    assert "ok" in got, got
    assert 0 < got["ok"] <= loopfs.MIN_SIZE
