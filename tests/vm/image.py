"""The Debian 13 machine and build root for tests/vm/, built once and cached.

- `machine()`: a bootable Debian 13 disk image (ext4, made with `mkfs.ext4 -d`
  from an mmdebstrap root, nothing mounted) plus its own kernel and initrd,
  with the packages in packages.txt. It boots into `leviath-vmtest.service`,
  which mounts the 9p share `host` at /mnt/host, runs /mnt/host/inside.sh and
  powers off whatever happens.
- `build_root()`: a Debian 13 root with the .deb's Build-Depends and lintian,
  in which `build_deb()` builds the package from the checkout, so the build
  sees Debian 13's debhelper and systemd.pc (units in /usr/lib/systemd/system).

Both come from the trixie suite of the Debian mirror apt on this machine is
configured with (read from /etc/apt/sources.list*), and live under
/var/cache/leviath-vm/ (LEVIATH_VM_CACHE) keyed by a hash of what goes in.
Run `python3 tests/vm/image.py` to build both ahead of the tests.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent.parent
CACHE = Path(os.environ.get("LEVIATH_VM_CACHE", "/var/cache/leviath-vm"))
SUITE = "trixie"
# Bump when the recipe below changes in a way the package list does not show.
RECIPE = "3"
# Sparse (the host pays for what is written): room for the scratch of the
# several agents inside.sh holds at once under the default scratch_user_max of
# 50% of scratch_dir's filesystem (issue 46's admission check refused a second
# 1 GiB agent on a 4G disk with ~2G free).
IMAGE_SIZE = "12G"
BUILD_PACKAGES = [
    "debhelper", "dh-python", "pybuild-plugin-pyproject", "python3-all",
    "python3-setuptools", "pkgconf", "systemd-dev", "lintian",
    # The unit tests run here too, on Debian 13's python3 and libraries: at
    # native speed, where under emulation in the VM they took over 20 minutes.
    "python3-pydantic", "python3-dbus-fast", "python3-pystemd", "python3-prctl",
    "python3-asyncssh", "python3-cryptography", "python3-pytest", "python3-hypothesis",
    "dbus-daemon",
    # The one HTTP layer (issue 44) and the metrics file's parser in its test (issue 46).
    "python3-h11", "python3-prometheus-client",
    # test_proxy_inject runs the real `git credential fill` against the
    # settings a container agent gets (issue 30).
    "git",
]
DEBIAN_CODENAMES = {"bullseye", "bookworm", "trixie", "forky", "sid",
                    "stable", "testing", "unstable", "oldstable"}

VMTEST_UNIT = """\
[Unit]
Description=leviathd VM test: run /mnt/host/inside.sh, then power off
Wants=dbus.service
After=dbus.service systemd-user-sessions.service local-fs.target
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
Type=oneshot
ExecStartPre=/bin/mkdir -p /mnt/host
ExecStartPre=/bin/mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 host /mnt/host
ExecStart=/bin/bash /mnt/host/inside.sh
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
"""

# Timers and services that would only take CPU from the tests under emulation.
MASKED = [
    "apt-daily.timer", "apt-daily-upgrade.timer", "man-db.timer", "e2scrub_all.timer",
    "fstrim.timer", "dpkg-db-backup.timer", "systemd-tmpfiles-clean.timer",
    "podman-auto-update.timer", "podman-clean-transient.service", "podman-restart.service",
    "serial-getty@ttyS0.service", "getty@tty1.service",
]


def log(msg: str) -> None:
    print(f"vm-image: {msg}", file=sys.stderr, flush=True)


def debian_mirror() -> str:
    """The Debian archive URI apt is configured with (deb822 or one-line)."""
    files = [Path("/etc/apt/sources.list")]
    d = Path("/etc/apt/sources.list.d")
    if d.is_dir():
        files += sorted(d.iterdir())
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        if f.suffix == ".sources":
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(
                    (m.group(1).lower(), m.group(2).strip())
                    for m in re.finditer(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M)
                )
                suites = set(fields.get("suites", "").split())
                if suites & DEBIAN_CODENAMES and "main" in fields.get("components", ""):
                    return fields.get("uris", "").split()[0]
        else:
            for line in text.splitlines():
                parts = re.sub(r"\[[^]]*\]", "", line).split()
                if len(parts) >= 4 and parts[0] == "deb" and parts[2] in DEBIAN_CODENAMES:
                    return parts[1]
    raise RuntimeError("no Debian archive found in /etc/apt/sources.list*")


def packages() -> list[str]:
    out = []
    for line in (HERE / "packages.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def _week() -> str:
    """The ISO week: part of every cache key, so that the images are made
    again from Debian's current packages at least once a week (issue 49: an
    image cached for months hid that trixie's podman no longer found
    libsystemd-journal, which every user installing today met)."""
    year, week, _ = datetime.date.today().isocalendar()
    return f"{year}-W{week:02d}"


def _prune(kind: str, keep: Path) -> None:
    """Drop the older images of one kind once a new one is made."""
    for old in CACHE.glob(f"{kind}-*"):
        # A build root another run still builds in (its build-PID folder) stays.
        busy = any(d.name.removeprefix("build-").isdigit()
                   and Path(f"/proc/{d.name.removeprefix('build-')}").exists()
                   for d in old.glob("build-*"))
        if old != keep and old.is_dir() and not busy:
            shutil.rmtree(old, ignore_errors=True)


def _key(*parts: object) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
    return h.hexdigest()[:16]


def _mmdebstrap(target: Path, variant: str, include: list[str], hooks: list[str]) -> None:
    cmd = [
        "mmdebstrap", "--mode=root", f"--variant={variant}",
        "--include=" + ",".join(include),
        "--aptopt=Acquire::Retries=3",
        *[f"--customize-hook={h}" for h in hooks],
        SUITE, str(target), f"deb {debian_mirror()} {SUITE} main",
    ]
    log("running " + " ".join(cmd[:3]) + f" ... {SUITE} ({len(include)} packages)")
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def _locked(what: str) -> Iterator[None]:
    """One builder of each cached thing at a time; a second run waits, then
    finds it built."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{what}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def machine() -> Path:
    """The cached folder holding disk.img, vmlinuz and initrd.img."""
    with _locked("machine"):
        return _machine()


def _machine() -> Path:
    pkgs = packages()
    out = CACHE / f"machine-{_key(pkgs, RECIPE, VMTEST_UNIT, MASKED, IMAGE_SIZE, _week())}"
    if (out / "disk.img").is_file():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="machine-", dir=CACHE))
    try:
        root = work / "root"
        unit = work / "leviath-vmtest.service"
        unit.write_text(VMTEST_UNIT)
        hooks = [
            "echo leviath-vm > \"$1/etc/hostname\"",
            "echo '/dev/vda / ext4 rw,errors=remount-ro 0 1' > \"$1/etc/fstab\"",
            f"cp {unit} \"$1/etc/systemd/system/\"",
            "mkdir -p \"$1/etc/systemd/system/multi-user.target.wants\"",
            "ln -sf /etc/systemd/system/leviath-vmtest.service "
            "\"$1/etc/systemd/system/multi-user.target.wants/leviath-vmtest.service\"",
            *[f"ln -sf /dev/null \"$1/etc/systemd/system/{u}\"" for u in MASKED],
            "mkdir -p \"$1/var/log/journal\"",
            "chroot \"$1\" passwd -d root",
            # Test users: alice and bob become members of `leviath` once the package
            # has made the group; carol never does.
            "for u in alice bob carol; do chroot \"$1\" useradd -m -s /bin/bash $u; done",
        ]
        _mmdebstrap(root, "apt", pkgs, hooks)
        boot = root / "boot"
        kernels = sorted(boot.glob("vmlinuz-*"))
        initrds = sorted(boot.glob("initrd.img-*"))
        if not kernels or not initrds:
            raise RuntimeError(f"no kernel/initrd in the image's /boot: {list(boot.iterdir())}")
        shutil.copy(kernels[-1], work / "vmlinuz")
        shutil.copy(initrds[-1], work / "initrd.img")
        log(f"mkfs.ext4 -d ({IMAGE_SIZE}, sparse)")
        subprocess.run(
            ["mkfs.ext4", "-q", "-L", "root", "-d", str(root), str(work / "disk.img"), IMAGE_SIZE],
            check=True,
        )
        shutil.rmtree(root)
        unit.unlink()
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
        _prune("machine", out)
        return out
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def build_root() -> Path:
    with _locked("buildroot"):
        return _build_root()


def _build_root() -> Path:
    out = CACHE / f"buildroot-{_key(BUILD_PACKAGES, RECIPE, _week())}"
    if (out / "usr/bin/dpkg-buildpackage").exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="buildroot-", dir=CACHE))
    try:
        _mmdebstrap(work / "root", "buildd", BUILD_PACKAGES, [])
        if out.exists():
            shutil.rmtree(out)
        (work / "root").rename(out)
        _prune("buildroot", out)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _source_files() -> list[str]:
    """The checkout's files as a clean clone has them, plus uncommitted edits."""
    r = subprocess.run(
        ["git", "-C", str(CHECKOUT), "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True, text=True, check=True,
    )
    return [f for f in r.stdout.splitlines() if (CHECKOUT / f).is_file()]


UPGRADE_SUFFIX = "+vmupgrade1"


# This run's folder in the build root: runs at once (two CI jobs, two people)
# must not build in each other's tree.
BUILD = f"build-{os.getpid()}"


def _sweep_builds(root: Path) -> None:
    """Remove the folders of runs whose process is gone."""
    for d in root.glob("build-*"):
        pid = d.name.removeprefix("build-")
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)


def build_debs(dest: Path) -> str:
    """Build leviathd_*.deb from the checkout in the Debian 13 build root into
    dest, and the same source as a higher version (changelog entry added here
    only) into dest/upgrade for the upgrade check. Returns lintian's output on
    the first."""
    root = build_root()
    _sweep_builds(root)
    build = root / BUILD
    shutil.rmtree(build, ignore_errors=True)
    src = build / "leviathd"
    src.mkdir(parents=True)
    with open(build / "src.tar", "wb") as tar:
        subprocess.run(["tar", "-C", str(CHECKOUT), "-cf", "-", *_source_files()],
                       check=True, stdout=tar)
    subprocess.run(["tar", "-C", str(src), "-xf", str(build / "src.tar")], check=True)
    shutil.copy(HERE / "build-deb.sh", build / "build-deb.sh")
    _in_root(root, f"/bin/sh /{BUILD}/build-deb.sh \"$0\" /{BUILD}", UPGRADE_SUFFIX)
    for sub in ("", "upgrade"):
        debs = sorted((build / "out" / sub).glob("leviathd_*.deb"))
        if len(debs) != 1:
            raise RuntimeError(f"expected one leviathd_*.deb in out/{sub}, found {debs}")
        (dest / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy(debs[0], dest / sub / debs[0].name)
    return (build / "lintian.log").read_text(errors="replace")


def _in_root(root: Path, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """command (sh, with args as $0...) in the Debian 13 root, in a private
    mount namespace for its /proc, /dev and /sys (the unit tests of the broker
    read their cgroup, as they do on the host): nothing stays mounted on the host."""
    script = (
        f'mount -t proc proc "{root}/proc" && mount --rbind /dev "{root}/dev" && '
        f'mount --rbind /sys "{root}/sys" && '
        f'exec chroot "{root}" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin '
        f'HOME=/root LANG=C.UTF-8 CI=true /bin/sh -c \'{command}\' "$@"'
    )
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *args],
        check=True, stdin=subprocess.DEVNULL, text=True,
    )


def unit_tests() -> tuple[int, str]:
    """tests/unit on Debian 13's python3 and libraries, in the build root, on
    the checkout copied there by build_debs. Returns (status, output)."""
    root = build_root()
    b = f"/{BUILD}"
    _in_root(root, f"cd {b}/leviathd && {{ python3 --version; dpkg-query -W python3-dbus-fast "
             "python3-pydantic python3-pystemd python3-prctl; python3 -m pytest -q "
             # The pinned Claude Code the key table is read from is the CI host's
             # (scripts/setup's npm prefix); that test runs there, not here.
             "-p no:cacheprovider -rs --durations=5 "
             "--deselect tests/unit/test_claudestate_keys.py "
             # unshare's pid namespace and a named cgroup of the test's own are the
             # host's (the build root is a chroot in a mount namespace only).
             "--deselect tests/unit/test_join_facts.py "
             # The polkit rules' syntax check runs node (the host has it, from
             # the agent CLIs' npm prefix); Debian's build root has none.
             "--deselect tests/unit/test_units_and_polkit.py::"
             "test_the_rules_are_es5_that_polkitd_can_load "
             f"tests/unit; }} >{b}/unit.log 2>&1; "
             f"echo $? >{b}/unit.rc")
    return (int((root / BUILD / "unit.rc").read_text()),
            (root / BUILD / "unit.log").read_text(errors="replace"))


if __name__ == "__main__":
    log(f"machine: {machine()}")
    log(f"build root: {build_root()}")
