"""Boot a real systemd in throwaway namespaces (docs/testbed.md) and drive it.

Stage 1 (host, root): child cgroups below ours in every hierarchy, then
`unshare` into new pid, mount, uts, ipc, cgroup (and by default net) namespaces.
Stage 2 (inside): an overlay root (lowerdir=/, upper on a tmpfs) with fresh
/dev, sysfs, cgroup, proc, /run and /tmp mounts, `pivot_root`, exec systemd.

Beyond the recipe, stage 2 keeps the host safe from what a booted system does
with host-wide resources: /dev is a fresh tmpfs with only the harmless device
nodes bound in (no host tty, no /dev/kmsg, nothing created in the host's
devtmpfs), /sys and /proc/sys are read-only (no sysctl or uevent reaches the
host), the network namespace is new unless asked otherwise (services bound to
a port stay inside), and placeholder mounts keep systemd from creating new
machine-wide v1 hierarchies for controllers the host left unmounted.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import cgroups

SYSTEMD = "/lib/systemd/systemd"
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Device nodes that are safe to share with the host: they carry no host state.
SHARED_DEVICES = ("null", "zero", "full", "random", "urandom", "tty", "fuse", "net/tun",
                  "loop-control")

# Units that would do host-ish work in the bed (a database on the host's data,
# daily apt runs, gettys on a console that is a log file): masked in the overlay.
MASKED_UNITS = (
    "postgresql.service",
    "postgresql@.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "man-db.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "console-getty.service",
    "container-getty@.service",
    "getty@.service",
    "serial-getty@.service",
    "systemd-timesyncd.service",
    "systemd-modules-load.service",
    # The host's SSH server, if it runs one: tests start their own sshd.
    "ssh.service",
    "ssh.socket",
    # Machine-wide kernel interfaces: nothing in the bed needs them mounted.
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "sys-kernel-config.mount",
    "proc-sys-fs-binfmt_misc.automount",
    "systemd-binfmt.service",
    # Hardware daemons a package may have brought (prometheus-node-exporter's
    # collectors recommend them): with no such hardware in the bed they fail,
    # and a failed unit is a degraded bed.
    "nvmf-autoconnect.service",
    "nvmefc-boot-connections.service",
    "openipmi.service",
    "smartmontools.service",
    "smartd.service",
    "prometheus-node-exporter-apt.timer",
    "prometheus-node-exporter-ipmitool-sensor.timer",
    "prometheus-node-exporter-mellanox-hca-temp.timer",
    "prometheus-node-exporter-nvme.timer",
    "prometheus-node-exporter-smartmon.timer",
    # Debian's registry (issue 49's stand-in) starts on install with a config
    # whose htpasswd path is a folder: a failed unit. Tests run their own.
    "docker-registry.service",
)


# PID 1 of a bed booted without systemd (Testbed(systemd=False)): starts the
# system bus, reaps orphans, and on SIGTERM ends everything in the namespace.
NO_SYSTEMD_INIT = "/.testbed-init"
NO_SYSTEMD_INIT_COMM = ".testbed-init"
NO_SYSTEMD_INIT_SOURCE = """#!/usr/bin/python3
import os, signal, subprocess, time

class Stop(Exception):
    pass

def stop(signum, frame):
    raise Stop()

signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
os.makedirs("/run/dbus", exist_ok=True)
log = open("/run/testbed-init.log", "ab")
subprocess.Popen(["dbus-daemon", "--system", "--nofork", "--nopidfile"],
                 stdin=subprocess.DEVNULL, stdout=log, stderr=log)
try:
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(0.2)
except Stop:
    pass
for sig in (signal.SIGTERM, signal.SIGKILL):
    try:
        os.kill(-1, sig)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        time.sleep(0.05)
"""


class TestbedUnavailable(Exception):
    """This host cannot boot the test bed (not root, no namespaces, ...)."""


class TestbedError(Exception):
    """The test bed was bootable but something in it failed."""


class CommandFailed(subprocess.CalledProcessError):
    """A command run inside the bed exited non-zero; str() shows its output."""

    def __str__(self) -> str:
        where = f" as {self.user}" if self.user else ""
        return (
            f"command {self.cmd!r}{where} exited {self.returncode}\n"
            f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"
        )

    user: str | None = None


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[str, ...]


def check_host() -> None:
    """Raise TestbedUnavailable with the precise reason when this host cannot boot it."""
    if os.geteuid() != 0:
        raise TestbedUnavailable(f"the test bed needs root (euid is {os.geteuid()})")
    for tool in ("unshare", "nsenter", "setpriv", "pivot_root", "mount", "tar"):
        if shutil.which(tool) is None:
            raise TestbedUnavailable(f"{tool} is not installed (util-linux)")
    if not Path(SYSTEMD).exists():
        raise TestbedUnavailable(f"{SYSTEMD} is missing (apt-get install systemd)")
    for ns in ("pid", "mnt", "uts", "ipc", "cgroup", "net"):
        if not Path(f"/proc/self/ns/{ns}").exists():
            raise TestbedUnavailable(f"the kernel has no {ns} namespaces")
    if "overlay" not in Path("/proc/filesystems").read_text():
        with contextlib.suppress(OSError):
            subprocess.run(["modprobe", "overlay"], capture_output=True, check=False)
        if "overlay" not in Path("/proc/filesystems").read_text():
            raise TestbedUnavailable("the kernel has no overlay filesystem")
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount", "--cgroup", "--uts", "--ipc", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        raise TestbedUnavailable(f"cannot create namespaces: {probe.stderr.strip()}")
    if not cgroups.hierarchies():
        raise TestbedUnavailable("no cgroup hierarchy is mounted on this host")


def systemd_version() -> int:
    out = subprocess.run([SYSTEMD, "--version"], capture_output=True, text=True, check=False)
    try:
        return int(out.stdout.split()[1])
    except (IndexError, ValueError):
        return 0


def _stage2_script(
    hs: list[cgroups.Hierarchy], console: Path, name: str, *, systemd: bool = True
) -> str:
    """The shell script run as the first process of the new namespaces."""
    q = shlex.quote
    lines = [
        "set -eu",
        # Nothing we mount from here on may propagate back to the host.
        "mount --make-rprivate /",
        # The scratch tmpfs covers /tmp only in this private mount namespace.
        "mount -t tmpfs -o mode=700 testbed-scratch /tmp",
        "mkdir /tmp/upper /tmp/work /tmp/root",
        "mount -t overlay -o lowerdir=/,upperdir=/tmp/upper,workdir=/tmp/work testbed /tmp/root",
        "R=/tmp/root",
        "mount -t tmpfs -o mode=755,nosuid testbed-dev $R/dev",
    ]
    for dev in SHARED_DEVICES:
        d = q(f"/dev/{dev}")
        lines.append(
            f"if [ -c {d} ]; then mkdir -p \"$(dirname $R{d})\"; : > $R{d}; "
            f"mount --bind {d} $R{d}; fi"
        )
    lines += [
        "mkdir $R/dev/pts $R/dev/shm",
        "mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5 devpts $R/dev/pts",
        "ln -s pts/ptmx $R/dev/ptmx",
        "mount -t tmpfs -o mode=1777,nosuid,nodev testbed-shm $R/dev/shm",
        "ln -s /proc/self/fd $R/dev/fd",
        "ln -s /proc/self/fd/0 $R/dev/stdin",
        "ln -s /proc/self/fd/1 $R/dev/stdout",
        "ln -s /proc/self/fd/2 $R/dev/stderr",
        # The console is a log file on the host, so boot messages can be read.
        f": > $R/dev/console; mount --bind {q(str(console))} $R/dev/console",
        "mount -t sysfs -o ro,nosuid,nodev,noexec sysfs $R/sys",
        "mount -t tmpfs -o mode=755,nosuid,nodev,noexec testbed-cgroup $R/sys/fs/cgroup",
    ]
    for h in hs:
        target = "$R/sys/fs/cgroup" + (f"/{q(h.dirname)}" if h.dirname else "")
        opts = f"-o {q(h.options)} " if h.options else ""
        lines.append(f"mkdir -p {target}; mount -t {h.fstype} {opts}{h.fstype} {target}")
    # Where the host combined controllers (cpu -> cpu,cpuacct), keep the same links.
    for link in sorted(Path("/sys/fs/cgroup").iterdir()):
        if link.is_symlink():
            lines.append(f"ln -s {q(os.readlink(link))} $R/sys/fs/cgroup/{q(link.name)}")
    taken = {c for h in hs for c in h.options.split(",")}
    free = [c for c in cgroups.unmounted_v1_controllers() if c not in taken]
    if any(h.fstype == "cgroup" for h in hs):
        joined = {"net_cls": "net_cls,net_prio", "net_prio": "net_cls,net_prio"}
        for place in sorted({joined.get(c, c) for c in free}):
            p = f"$R/sys/fs/cgroup/{q(place)}"
            lines.append(f"mkdir -p {p}; mount -t tmpfs -o ro,size=4k testbed-placeholder {p}")
    lines += [
        "mount -t proc -o nosuid,nodev,noexec proc $R/proc",
        "mount --bind $R/proc/sys $R/proc/sys",
        "mount -o remount,bind,ro $R/proc/sys",
        "if [ -e $R/proc/sysrq-trigger ]; then mount --bind $R/proc/sysrq-trigger "
        "$R/proc/sysrq-trigger; mount -o remount,bind,ro $R/proc/sysrq-trigger; fi",
        # Agents' scratch on the host's disk, as on a real machine: the
        # overlay's upper layer is memory, and a scratch image there would be
        # charged to the agent's memory (sandbox/loopfs.py). In the bed's
        # workdir, removed with it.
        f"mkdir -p $R/var/lib/leviath/scratch; mount --bind {q(str(console.parent / 'scratch'))} "
        "$R/var/lib/leviath/scratch",
        "mount -t tmpfs -o mode=755,nosuid,nodev testbed-run $R/run",
        "mount -t tmpfs -o mode=1777,nosuid,nodev testbed-tmp $R/tmp",
        "mkdir -p $R/etc/systemd/system",
    ]
    for unit in MASKED_UNITS:
        lines.append(f"ln -sf /dev/null $R/etc/systemd/system/{q(unit)}")
    if not systemd:
        lines += [
            f"cat > $R{NO_SYSTEMD_INIT} <<'TESTBED_INIT_EOF'",
            NO_SYSTEMD_INIT_SOURCE.rstrip("\n"),
            "TESTBED_INIT_EOF",
            f"chmod 755 $R{NO_SYSTEMD_INIT}",
        ]
    lines += [
        f"echo {q(name)} > $R/etc/hostname",
        f"hostname {q(name[:63])}",
        "cd $R",
        "mkdir -p .testbed-oldroot",
        "pivot_root . .testbed-oldroot",
        "umount -l /.testbed-oldroot",
        "rmdir /.testbed-oldroot",
        f"export container={q('leviath-testbed')}",
        "exec " + " ".join(q(a) for a in (_systemd_argv() if systemd else [NO_SYSTEMD_INIT])),
    ]
    return "\n".join(lines) + "\n"


def _systemd_argv() -> list[str]:
    argv = [SYSTEMD, "--system", "systemd.getty_auto=0", "systemd.firstboot=0"]
    if systemd_version() >= 256:
        # systemd 256+ refuses cgroup v1 (hybrid) unless forced; in a container
        # it reads these "kernel command line" options from its own argv.
        argv += ["SYSTEMD_CGROUP_ENABLE_LEGACY_FORCE=1", "systemd.unified_cgroup_hierarchy=0"]
    return argv


def _die_with_parent() -> None:
    # If the process that booted the bed dies (even by SIGKILL), unshare gets
    # SIGKILL, and its --kill-child takes systemd and the whole pid namespace down.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Testbed:
    """A booted systemd in its own namespaces, with an overlay root."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    def __init__(
        self, *, share_network: bool = False, keep_logs: bool = False, systemd: bool = True
    ) -> None:
        self.name = f"{cgroups.PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        # systemd=False: PID 1 is a small init (NO_SYSTEMD_INIT_SOURCE) that
        # starts only the system bus; nothing else of systemd runs.
        self.systemd = systemd
        self.share_network = share_network
        self.keep_logs = keep_logs or os.environ.get("LEVIATH_TESTBED_KEEP") == "1"
        self.workdir = Path(tempfile.mkdtemp(prefix=self.name + ".", dir="/var/tmp"))
        self.console_log = self.workdir / "console.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._cgroups: list[Path] = []
        self._pid: int | None = None
        self.users: dict[str, User] = {}
        self.boot_seconds: float | None = None

    # ---- lifecycle -------------------------------------------------------

    @property
    def pid(self) -> int:
        """Host pid of the bed's systemd (PID 1 inside)."""
        if self._pid is None:
            raise TestbedError("the test bed is not booted")
        return self._pid

    def start(self, timeout: float = 60.0) -> None:
        """Stage 1 and 2: boot systemd. Does not wait for it to reach running."""
        check_host()
        hs = cgroups.hierarchies()
        cgroups.remove_stale(hs)
        for old in self.workdir.parent.glob(cgroups.PREFIX + "*"):
            if cgroups.owner_dead(old.name) and not self.keep_logs:
                shutil.rmtree(old, ignore_errors=True)
        self._cgroups = cgroups.create_children(hs, self.name)
        self.console_log.touch()
        (self.workdir / "scratch").mkdir(mode=0o711)
        stage1 = 'while [ "$1" != -- ]; do echo $$ > "$1"; shift; done; shift; exec "$@"'
        namespaces = ["--pid", "--fork", "--kill-child", "--mount", "--uts", "--ipc", "--cgroup"]
        if not self.share_network:
            namespaces.append("--net")
        argv = [
            "sh", "-c", stage1, "stage1",
            *[str(c / "cgroup.procs") for c in self._cgroups], "--",
            "unshare", *namespaces,
            "sh", "-c", _stage2_script(hs, self.console_log, self.name, systemd=self.systemd),
            "stage2",
        ]  # fmt: skip
        log = (self.workdir / "stage.log").open("wb")
        self._started = time.monotonic()
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's Ctrl-C goes to the tests, not to PID 1
            preexec_fn=_die_with_parent,
        )
        log.close()
        self._pid = self._find_systemd(timeout)

    def _find_systemd(self, timeout: float) -> int:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        children = Path(f"/proc/{self._proc.pid}/task/{self._proc.pid}/children")
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise TestbedError(f"the test bed did not boot:\n{self.logs()}")
            with contextlib.suppress(OSError, ValueError):
                for pid in self._children_of(self._proc.pid, children):
                    comm = "systemd" if self.systemd else NO_SYSTEMD_INIT_COMM
                    if Path(f"/proc/{pid}/comm").read_text().strip() == comm:
                        return int(pid)
            time.sleep(0.02)
        raise TestbedError(f"systemd did not start within {timeout}s:\n{self.logs()}")

    @staticmethod
    def _children_of(parent: int, children: Path) -> list[str]:
        if children.exists():  # needs CONFIG_PROC_CHILDREN
            return children.read_text().split()
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError):
                # Fields after the ")" closing the command name: state, ppid, ...
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    found.append(stat.parent.name)
        return found

    def wait_running(self, timeout: float = 90.0) -> str:
        """Wait until systemd has finished booting; returns "running" or raises.

        "degraded" (a failed unit) raises too, naming the failed units.
        """
        deadline = time.monotonic() + timeout
        state = "unknown"
        if not self.systemd:
            return self._wait_bus(deadline)
        while time.monotonic() < deadline:
            left = max(1.0, deadline - time.monotonic())
            try:
                r = self.run(["systemctl", "is-system-running", "--wait"], check=False,
                             timeout=left)  # fmt: skip
            except subprocess.TimeoutExpired:
                break
            state = r.stdout.strip()
            if state == "running":
                if self.boot_seconds is None:
                    self.boot_seconds = time.monotonic() - self._started
                return state
            if state == "degraded":
                failed = self.run(["systemctl", "--failed", "--no-pager", "--plain"], check=False)
                raise TestbedError(f"the test bed booted degraded:\n{failed.stdout}")
            if self._proc is not None and self._proc.poll() is not None:
                raise TestbedError(f"systemd exited during boot:\n{self.logs()}")
            time.sleep(0.1)
        raise TestbedError(f"systemd not running after {timeout}s (state {state!r})")

    def _wait_bus(self, deadline: float) -> str:
        """Without systemd, "running" means the system bus answers."""
        while time.monotonic() < deadline:
            r = self.run(["busctl", "--system", "list", "--no-pager"], check=False, timeout=10)
            if r.returncode == 0:
                if self.boot_seconds is None:
                    self.boot_seconds = time.monotonic() - self._started
                return "running"
            if self._proc is not None and self._proc.poll() is not None:
                raise TestbedError(f"the init exited during boot:\n{self.logs()}")
            time.sleep(0.1)
        raise TestbedError(f"the system bus did not come up:\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for f in ("stage.log", "console.log"):
            with contextlib.suppress(OSError):
                text = (self.workdir / f).read_text(errors="replace")
                parts.append(f"--- {f} ---\n{text[-6000:]}")
        return "\n".join(parts)

    def stop(self, timeout: float = 30.0) -> None:
        """Power the bed off and remove everything it left on the host.

        Safe to call more than once, and after a failed or partial boot.
        """
        proc = self._proc
        if proc is not None and proc.poll() is None:
            if self._pid is not None and not self.systemd:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._pid, signal.SIGTERM)  # the init ends everything
            elif self._pid is not None:
                with contextlib.suppress(Exception):
                    self.run(["systemctl", "poweroff", "--no-block"], check=False, timeout=10)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                # PID 1 of a namespace takes SIGKILL from an ancestor; the
                # kernel then kills everything else in the namespace.
                if self._pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self._pid, signal.SIGKILL)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
        self._pid = None
        errors = []
        for c in sorted(self._cgroups, key=lambda p: len(p.parts), reverse=True):
            try:
                cgroups.remove_tree(c)
            except OSError as e:
                errors.append(str(e))
        self._cgroups = []
        if not self.keep_logs:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if errors:
            raise TestbedError("cleanup incomplete: " + "; ".join(errors))

    def __enter__(self) -> Testbed:
        try:
            self.start()
            self.wait_running()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- running commands inside -----------------------------------------

    def command(
        self,
        cmd: Sequence[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> list[str]:
        """The host argv that runs `cmd` inside the bed (for Popen by callers).

        The process first joins the bed's root cgroups (from the host, where
        that is allowed): a process left in a cgroup outside the namespace's
        root could not be moved into a scope by systemd on cgroup2.
        """
        extra = [f"{k}={v}" for k, v in (env or {}).items()]
        if user is None or user == "root":
            inner = ["env", "-i", "HOME=/root", "USER=root", "LOGNAME=root", "SHELL=/bin/bash",
                     f"PATH={ROOT_PATH}", "LANG=C.UTF-8", *extra, *cmd]  # fmt: skip
            wd = cwd or "/"
        else:
            inner = ["setpriv", f"--reuid={user}", f"--regid={self._primary_group(user)}",
                     "--init-groups", "--reset-env", "--",
                     "env", "LANG=C.UTF-8", *extra, *cmd]  # fmt: skip
            wd = cwd or (self.users[user].home if user in self.users else "/")
        join = 'while [ "$1" != -- ]; do echo $$ > "$1"; shift; done; shift; exec "$@"'
        return [
            "sh", "-c", join, "join",
            *[str(c / "cgroup.procs") for c in self._cgroups], "--",
            "nsenter", "-t", str(self.pid), "-a", "-r", f"--wdns={wd}", *inner,
        ]  # fmt: skip

    def _primary_group(self, user: str) -> str:
        if user in self.users:
            return str(self.users[user].gid)
        r = self.run(["id", "-g", user])
        return r.stdout.strip()

    def run(
        self,
        cmd: Sequence[str] | str,
        user: str | None = None,
        *,
        check: bool = True,
        input: str | bytes | None = None,
        timeout: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the bed, as root or as `user` (login-like env).

        `cmd` as a string runs through `sh -c`. Output is captured as text
        (bytes `input` is sent as is). With check=True a non-zero exit raises
        CommandFailed whose message holds stdout and stderr.
        """
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        full = self.command(argv, user=user, env=env, cwd=cwd)
        data = input.encode() if isinstance(input, str) else input
        proc = subprocess.Popen(
            full,
            stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(data, timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        result = subprocess.CompletedProcess(
            argv, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
        )
        if check and proc.returncode != 0:
            e = CommandFailed(proc.returncode, argv, result.stdout, result.stderr)
            e.user = user
            raise e
        return result

    # ---- files -----------------------------------------------------------

    def copy_in(self, src: str | os.PathLike[str], dest: str, *, mode: int | None = None) -> None:
        """Copy a host file or folder (recursively) to `dest` inside the overlay root.

        Goes through tar inside the bed, so symlinks in `dest` resolve as they
        do in the bed, never against the host's root. Owner becomes root.
        """
        src = Path(src)
        buf = io.BytesIO()

        def clean(ti: tarfile.TarInfo) -> tarfile.TarInfo | None:
            if "__pycache__" in Path(ti.name).parts or ti.name.endswith(".pyc"):
                return None
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = "root"
            if mode is not None and ti.isfile():
                ti.mode = mode
            return ti

        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(src, arcname=os.path.basename(dest.rstrip("/")) or ".", filter=clean)
        parent = os.path.dirname(dest.rstrip("/")) or "/"
        self.run(["mkdir", "-p", parent])
        self.run(["tar", "-C", parent, "--no-same-owner", "-xf", "-"], input=buf.getvalue())

    def write_file(self, path: str, content: str | bytes, *, mode: int = 0o644) -> None:
        """Create or replace a file inside the overlay root (parents created)."""
        data = content.encode() if isinstance(content, str) else content
        q = shlex.quote
        self.run(
            f"mkdir -p {q(os.path.dirname(path))} && cat > {q(path)}.new && "
            f"chmod {mode:o} {q(path)}.new && mv -f {q(path)}.new {q(path)}",
            input=data,
        )

    def read_file(self, path: str) -> str:
        return self.run(["cat", path]).stdout

    @contextlib.contextmanager
    def machine_config(self, text: str) -> Iterator[None]:
        """/etc/leviath/config.toml set to `text` and leviathd restarted on it;
        afterwards the file as it was (or none) and leviathd restarted again."""
        path = "/etc/leviath/config.toml"
        old = self.run(["cat", path], check=False)
        self.write_file(path, text)
        self.run(["systemctl", "restart", "leviathd"])
        try:
            yield
        finally:
            if old.returncode == 0:
                self.write_file(path, old.stdout)
            else:
                self.run(["rm", "-f", path])
            self.run(["systemctl", "restart", "leviathd"])

    # ---- users and services ----------------------------------------------

    def add_user(self, name: str, groups: Sequence[str] = ()) -> User:
        """Create a user (with home and own group) in the bed, in `groups`."""
        for g in groups:
            self.run(["groupadd", "-f", g])
        argv = ["useradd", "--create-home", "--user-group", "--shell", "/bin/bash"]
        if groups:
            argv += ["--groups", ",".join(groups)]
        self.run([*argv, name])
        uid = int(self.run(["id", "-u", name]).stdout)
        gid = int(self.run(["id", "-g", name]).stdout)
        # Rootless podman (each agent's engine) needs subordinate ids. useradd
        # gives them where /etc/subuid and /etc/subgid exist; a host without
        # those files gets a range here, one per uid, above what useradd uses.
        base = 1_000_000 + uid * 65536
        self.run(["sh", "-c", 'touch /etc/subuid /etc/subgid; grep -q "^$1:" /etc/subuid '
                  '&& grep -q "^$1:" /etc/subgid || usermod --add-subuids "$2-$3" '
                  '--add-subgids "$2-$3" "$1"', "sh", name, str(base), str(base + 65535)])
        home = self.run(["getent", "passwd", name]).stdout.split(":")[5]
        user = User(name, uid, gid, home, tuple(groups))
        self.users[name] = user
        return user

    def add_standard_users(self) -> dict[str, User]:
        """alice, bob in leviath; carol in no group; dave in leviath and leviath-admin."""
        for name, groups in STANDARD_USERS.items():
            if name not in self.users:
                self.add_user(name, groups)
        return {n: self.users[n] for n in STANDARD_USERS}

    def start_service(self, name: str, timeout: float = 60.0) -> None:
        """`systemctl start`; on failure raise with the unit's status and journal."""
        r = self.run(["systemctl", "start", name], check=False, timeout=timeout)
        if r.returncode != 0:
            raise TestbedError(f"systemctl start {name} failed:\n{r.stderr}\n{self.status(name)}")

    def status(self, unit: str) -> str:
        s = self.run(["systemctl", "status", "--no-pager", "--full", unit], check=False)
        j = self.journal(unit, lines=60)
        return f"{s.stdout}\n--- journal ---\n{j}"

    def journal(self, unit: str | None = None, *, lines: int = 200) -> str:
        argv = ["journalctl", "--no-pager", "-n", str(lines), "-o", "short-precise"]
        if unit:
            argv += ["-u", unit]
        return self.run(argv, check=False).stdout

    def install_project(self, checkout: str | os.PathLike[str]) -> None:
        from .project import install_project

        install_project(self, Path(checkout), systemd=self.systemd)


STANDARD_USERS: dict[str, tuple[str, ...]] = {
    "alice": ("leviath",),
    "bob": ("leviath",),
    "carol": (),
    "dave": ("leviath", "leviath-admin"),
}


@contextlib.contextmanager
def booted(**kwargs: bool) -> Iterator[Testbed]:
    """Boot a bed for the duration of a with-block; always cleaned up."""
    with Testbed(**kwargs) as bed:
        yield bed
