"""Stage 1 of the test bed recipe: the run's own cgroups, below this process's.

The booted systemd must see only a child of the cgroup the test runs in, never a
hierarchy root (docs/testbed.md, hazard 3). We read /proc/self/cgroup and
/proc/self/mountinfo instead of assuming a layout: on some machines cpu and
cpuacct are one hierarchy, on others (this one) two; some are pure cgroup2.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "leviath-testbed-"


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy as the host sees it."""

    fstype: str  # "cgroup" (v1) or "cgroup2"
    options: str  # mount options that re-create it, e.g. "cpu", "none,name=systemd"
    mountpoint: Path  # where the host has it, e.g. /sys/fs/cgroup/cpu
    current: Path  # the folder of the cgroup this process is in

    @property
    def dirname(self) -> str:
        """Name of its folder below /sys/fs/cgroup ("" when cgroup2 is mounted there)."""
        rel = os.path.relpath(self.mountpoint, "/sys/fs/cgroup")
        return "" if rel == "." else rel


def _mountinfo() -> list[tuple[str, str, str, str]]:
    """(root, mountpoint, fstype, super options) of every cgroup mount."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        fstype, _source, superopts = right.split()[:3]
        if fstype in ("cgroup", "cgroup2"):
            out.append((fields[3], fields[4].replace("\\040", " "), fstype, superopts))
    return out


def hierarchies() -> list[Hierarchy]:
    """Every cgroup hierarchy this process is in that the host has mounted."""
    mounts = _mountinfo()
    found: list[Hierarchy] = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _hid, controllers, path = line.split(":", 2)
        if controllers == "":
            fstype, wanted = "cgroup2", set[str]()
            options = ""
        else:
            fstype, wanted = "cgroup", set(controllers.split(","))
            options = controllers if "name=" not in controllers else "none," + controllers
        for root, mountpoint, mtype, superopts in mounts:
            if mtype != fstype:
                continue
            if fstype == "cgroup" and not wanted <= set(superopts.split(",")):
                continue
            # The mount may show a sub-tree (its root is not "/"): the path in
            # /proc/self/cgroup is then relative to the hierarchy, not the mount.
            if path != root and not path.startswith(root.rstrip("/") + "/"):
                continue
            rel = os.path.relpath(path, root)
            current = Path(mountpoint) if rel == "." else Path(mountpoint) / rel
            found.append(Hierarchy(fstype, options, Path(mountpoint), current))
            break
    return found


def unmounted_v1_controllers() -> list[str]:
    """Enabled v1 controllers with no hierarchy yet (hierarchy id 0 in /proc/cgroups).

    systemd mounts every controller it finds missing; in a cgroup namespace that
    would create a new machine-wide hierarchy whose root systemd then fills.
    We put a placeholder where systemd looks so it leaves them alone.
    """
    names = []
    for line in Path("/proc/cgroups").read_text().splitlines()[1:]:
        name, hier, _num, enabled = line.split()
        if hier == "0" and enabled == "1":
            names.append(name)
    return names


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_tree(top: Path, attempts: int = 50) -> None:
    """rmdir a cgroup and everything below it, deepest first.

    A cgroup can stay busy for a moment after its last process died (zombies
    being reaped), so retry before giving up.
    """
    for attempt in range(attempts):
        if not top.exists():
            return
        dirs = sorted(
            (Path(d) for d, _subdirs, _files in os.walk(top)),
            key=lambda p: len(p.parts),
            reverse=True,
        )
        busy = False
        for d in dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                busy = True
        if not busy:
            return
        time.sleep(0.1 if attempt < 20 else 0.3)
    raise OSError(f"cgroup {top} could not be removed (still busy)")


STALE = re.compile(re.escape(PREFIX) + r"(\d+)-[0-9a-f]+(\.|$)")


def owner_dead(name: str) -> bool:
    """Whether `name` belongs to a test bed whose booting process has died."""
    m = STALE.match(name)
    return m is not None and not _alive(int(m.group(1)))


def remove_stale(hs: list[Hierarchy]) -> list[Path]:
    """Remove run cgroups left behind by test beds whose owner process died
    (killed with SIGKILL: its bed died with it, but nothing ran rmdir)."""
    removed = []
    for h in hs:
        with contextlib.suppress(OSError):
            for child in h.current.iterdir():
                if child.is_dir() and owner_dead(child.name):
                    with contextlib.suppress(OSError):
                        remove_tree(child, attempts=5)
                        removed.append(child)
    return removed


def _delegate_controllers(parent: Path) -> None:
    """On cgroup2, make the parent's controllers available to the run's child.

    Only possible where the parent holds no processes itself (or is the root);
    in hybrid mode the cgroup2 hierarchy usually has no controllers at all.
    Best effort: the bed still boots without them, only without limits there.
    """
    with contextlib.suppress(OSError):
        for c in (parent / "cgroup.controllers").read_text().split():
            with contextlib.suppress(OSError):
                (parent / "cgroup.subtree_control").write_text(f"+{c}")


def create_children(hs: list[Hierarchy], name: str) -> list[Path]:
    """Create the run's child cgroup in every hierarchy; returns their folders."""
    created: list[Path] = []
    try:
        for h in hs:
            child = h.current / name
            child.mkdir()
            created.append(child)
            if h.fstype == "cgroup2":
                _delegate_controllers(h.current)
            if "cpuset" in h.options.split(","):
                # A new cpuset is empty and refuses tasks until given cpus and mems.
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (child / f).write_text((h.current / f).read_text())
    except BaseException:
        for c in reversed(created):
            with contextlib.suppress(OSError):
                remove_tree(c, attempts=5)
        raise
    return created
