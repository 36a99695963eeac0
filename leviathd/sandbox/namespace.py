"""The namespace launcher: realise a SandboxSpec and run its command.

One linear story, as in bubblewrap:

  parent (root, in the agent's scope, stdio connected)
    unshare PID, IPC, UTS (+ network) namespaces; bring `lo` up in a new
    network namespace; set the hostname; fork
  PID 1 of the new PID namespace
    unshare the mount namespace and make / private;
    pin every source by file descriptor (what is mounted is what was checked);
    mount a fresh tmpfs and build the root from the spec's table, in order;
    remount it read-only; pivot_root; detach the old root; set the hostname;
    then, where the host has catatonit (podman's init: a small C program that
    reaps, forwards signals and exits with its child's status), prepare the
    agent as below in this process and exec catatonit (a sealed copy the
    user may run but not read, so PID 1 stays non-dumpable: see
    _sealed_init), which runs the command: PID 1 holds a few hundred KB
    instead of a Python interpreter's megabytes (issue 18). Without
    catatonit: fork the agent, then drop to the user itself and reap until
    the agent ends
  the agent
    new session, drop to the user with no capabilities and no_new_privs,
    chdir to the workdir, a seccomp filter (no new namespaces, no mounts,
    no keyring, no TIOCSTI), exec.

The parent waits and returns the agent's exit status (128+signal when killed).
start() is the other ending, for an agent with no supervisor (detached, one
step; behind the proxy PID 1 also keeps the proxy's listening socket for
the daemon, with no relay process): PID 1 execs a sealed dash instead of
catatonit, which runs the command and writes its status into the exit
record it was handed, and the parent returns PID 1's pid at
once and may leave (sandbox/supervisor.py, _hand_over).
Anything that goes wrong before exec comes back to the parent over a
close-on-exec pipe and is raised as Unavailable; the namespaces die with their
processes, so a failed build leaves no mount behind on the host.

This changes the calling process's own namespaces: call it once, in a process
made for the agent.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import platform
import posixpath
import signal
import socket
import stat
import struct
import sys
from collections.abc import Callable, Iterator
from typing import NoReturn

from leviathd import fsids, resource_defaults
from leviathd.domain.sandbox import SandboxKind
from leviathd.errors import InvalidArgument, Unavailable
from leviathd.paths import runtime_dir
from leviathd.sandbox import guard, scratch, seccomp
from leviathd.sandbox.privileges import drop_to_user
from leviathd.sandbox.spec import (
    SYSTEM_DIRS,
    SYSTEM_LINK_DIRS,
    Mount,
    MountRole,
    SandboxSpec,
    is_within,
)

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_PR_SET_PDEATHSIG = 1

# Where the new root is assembled, in our private mount namespace only.
_BASE = "/tmp"
_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]

fsids.preload()

_SYS_MOUNT_SETATTR = 442  # the same number on every architecture (kernel 5.12)
_AT_SYMLINK_NOFOLLOW = 0x100
_AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


# Built in the daemon, which every fence's PID 1 is a fork of: no Python
# work of making them between the fork and the command (issue 18).
seccomp.prepare(allow_io_uring=False)
seccomp.prepare(allow_io_uring=True)


class FenceError(Exception):
    """A step of building the fence failed; the message says which."""


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise FenceError(f"{what}: {os.strerror(err)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    rc = _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data))
    _check(rc, f"mount {fstype or 'bind'} {source or ''} on {target}")


def umount2(target: str, flags: int) -> None:
    _check(_libc.umount2(_b(target), flags), f"umount {target}")


def setattr_recursive(path: str, attr_set: int) -> bool:
    """Add `attr_set` (MOUNT_ATTR_*) to the mount at `path` and every mount
    beneath it, in one call that changes all or none; the flags they have
    already (noexec, read-only) stay. False on a kernel without
    mount_setattr (before 5.12): the caller remounts one by one."""
    attr = _MountAttr(attr_set, 0, 0, 0)
    rc = _libc.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_long(-100),  # AT_FDCWD
                       _b(path), ctypes.c_uint(_AT_RECURSIVE | _AT_SYMLINK_NOFOLLOW),
                       ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))  # fmt: skip
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.ENOSYS:
        return False
    raise FenceError(f"mount_setattr on {path}: {os.strerror(err)}")


def _mount_setattr_known() -> bool:
    """Whether this kernel has mount_setattr: asked once, in the daemon,
    with arguments it refuses (no path), so nothing changes."""
    rc = _libc.syscall(ctypes.c_long(_SYS_MOUNT_SETATTR), ctypes.c_long(-1), None,
                       ctypes.c_uint(0), None, ctypes.c_size_t(0))  # fmt: skip
    return rc == 0 or ctypes.get_errno() not in (errno.ENOSYS, errno.EPERM)


HAVE_MOUNT_SETATTR = _mount_setattr_known()


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(fd, nstype), "setns")


def pivot_root(new_root: str, put_old: str) -> None:
    nr = _PIVOT_ROOT.get(platform.machine())
    if nr is None:
        raise FenceError(f"pivot_root: unknown architecture {platform.machine()}")
    _check(_libc.syscall(nr, _b(new_root), _b(put_old)), "pivot_root")


# --- the parent side --------------------------------------------------------


def _namespace_flags(spec: SandboxSpec) -> int:
    """The namespaces the parent unshares. The mount namespace is left to PID 1:
    pivot_root moves every process of a mount namespace, and the parent must
    keep the host's view to clean up after the agent."""
    flags = CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if not spec.network:
        flags |= CLONE_NEWNET
    return flags


def _loopback_up() -> None:
    """Bring `lo` up in the new network namespace.

    A single SIOCSIFFLAGS ioctl rather than pyroute2: importing pyroute2 costs
    about 200 ms on this class of machine, over ten times the whole fence's budget.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, 0x8913, ifreq))[1]  # SIOCGIFFLAGS
        # SIOCSIFFLAGS with IFF_UP added
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH14x", b"lo", flags | 0x1))
    finally:
        sock.close()


def run(
    spec: SandboxSpec, *, workdir_fd: int | None = None,
    ready: Callable[[], None] | None = None,
) -> int:
    """Build the fence described by `spec`, run its command inside, return its
    exit status. Must run as root, in a process of its own.

    `workdir_fd`: the workdir as opened by the user when the agent was asked
    for (sandbox/supervisor.py); it is what gets mounted, whatever the path names by now.
    The scratch tmpfs is normally mounted by the supervisor (scratch.enter);
    when it is not, this process mounts its own and drops it at the end.
    `ready`: called in PID 1 once the fence's mounts are all built, before
    anything of the command runs (the `shell` tool: the daemon marks the
    new mounts for its write watch then); raising fails the fence."""
    if spec.kind != SandboxKind.NAMESPACE:
        raise InvalidArgument(f"the namespace launcher cannot run a {str(spec.kind)!r} spec")
    if os.geteuid() != 0:
        raise Unavailable("the namespace fence needs root (run by leviathd)")
    existed = os.path.lexists(spec.scratch)
    mounted = scratch.open_mounted(spec) if existed else None
    if mounted is not None:
        os.close(mounted)
        return _run(spec, workdir_fd, ready)
    scratch.enter(spec)
    try:
        return _run(spec, workdir_fd, ready)
    finally:
        scratch.leave(spec)
        if not existed:
            scratch.remove(spec.scratch)


def start(
    spec: SandboxSpec, *, workdir_fd: int | None, exit_fd: int, shell: int | None = None,
    ready: Callable[[], None] | None = None, kept: tuple[int, int] | None = None,
) -> int:
    """Build the fence and start its PID 1, a sealed shell that runs the
    command and writes its exit status to `exit_fd`; return PID 1's pid (as
    seen here) once the command is about to run, without waiting for it.

    For an agent with nothing to copy or sequence (detached, one step): the
    caller may then exit, and PID 1, reparented, is the agent's only process
    of ours (issue 18), also for network = "proxy". Its parent's death
    does not end it.
    The caller has entered the scratch namespace (scratch.enter) and set its
    stdio to the agent's. `kept`: descriptors PID 1 holds (at OUT_KEEP_FD
    and ERR_KEEP_FD), closed for the command."""
    if spec.kind != SandboxKind.NAMESPACE:
        raise InvalidArgument("start() runs one namespace step")
    if shell is None:
        shell = sealed_shell()
    if shell is None:
        raise Unavailable("no shell to record the exit status (/usr/bin/dash)")
    listener = -1
    try:
        unshare(_namespace_flags(spec))
        if not spec.network:
            _loopback_up()
        if spec.proxy:
            # No relay process: PID 1 keeps the proxy's listening socket
            # (closed for the command) and the daemon accepts on a copy it
            # takes from there (pidfd_getfd), again after a restart.
            from leviathd.sandbox import forwarder

            listener = forwarder.listen().detach()
        _check(_libc.sethostname(_b(spec.hostname), len(spec.hostname.encode())), "sethostname")
    except (FenceError, OSError) as exc:
        if listener >= 0:
            os.close(listener)
        raise Unavailable(f"cannot build the namespace fence: {exc}") from exc
    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        _pid1(spec, wfd, workdir_fd, recorder=(shell, exit_fd, listener),
              ready=ready, kept=kept)  # never returns
    os.close(wfd)
    os.close(shell)
    if listener >= 0:
        os.close(listener)
    try:
        report = _read_all(rfd)
    finally:
        os.close(rfd)
    if report:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        raise Unavailable(f"cannot build the namespace fence: {report.decode(errors='replace')}")
    return pid


def ended_early(pid: int) -> tuple[int, bool] | None:
    """After start(): a PID 1 that is gone already, reaped: (status, killed).
    Killed (`lev stop` while its fence was built), the status is 128+N, as
    the shell would have recorded it had it run. Ended by itself, the shell
    ran the command and wrote the command's status to the record: its own
    exit status is printf's, not the agent's. None while it runs."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    if got == 0:
        return None
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status), True
    return os.waitstatus_to_exitcode(status), False


def _run(
    spec: SandboxSpec, workdir_fd: int | None, ready: Callable[[], None] | None = None
) -> int:
    relay = _unshare_fence(spec)
    try:
        return _run_pid1(spec, workdir_fd, ready)
    finally:
        _stop_relay(relay)


def _unshare_fence(spec: SandboxSpec) -> int:
    """Unshare the spec's namespaces in this process (its next fork is the
    fence's PID 1) and name the host: the relay's pid when behind the proxy,
    else 0. On failure the relay is stopped and Unavailable raised."""
    relay = 0
    try:
        flags = _namespace_flags(spec)
        if spec.proxy:
            # The network namespace first, so the relay to the daemon's proxy
            # lives in it but outside the agent's PID namespace.
            unshare(CLONE_NEWNET)
            _loopback_up()
            relay = _start_relay(spec)
            flags &= ~CLONE_NEWNET
        unshare(flags)
        if not spec.network and not spec.proxy:
            _loopback_up()
        _check(_libc.sethostname(_b(spec.hostname), len(spec.hostname.encode())), "sethostname")
    except (FenceError, OSError) as exc:
        _stop_relay(relay)
        raise Unavailable(f"cannot build the namespace fence: {exc}") from exc
    return relay


class StepNamespaces:
    """The PID, IPC, UTS (and network) namespaces of one step, entered by
    the supervisor itself (enter_step) so that its next fork is the step's
    PID 1: no worker process between them, whose fork and exit (a copy of
    the daemon's address space each) cost ~5 ms per start (issue 18).
    leave() takes the supervisor back to its own namespaces right after
    that fork; end() stops the relay once PID 1 has ended."""

    _KINDS = (("pid", CLONE_NEWPID), ("ipc", CLONE_NEWIPC), ("uts", CLONE_NEWUTS),
              ("net", CLONE_NEWNET))  # fmt: skip

    def __init__(self) -> None:
        self.saved: list[tuple[int, int]] = []
        self.relay = 0

    def leave(self) -> None:
        """Back to the namespaces held before, right after the fork of PID 1
        (a process whose PID namespace for children is not its own cannot
        start a thread); raises Unavailable when that fails (the caller must
        then end PID 1 and run nothing more). The relay stays, for end()."""
        problem = None
        for fd, kind in self.saved:
            try:
                setns(fd, kind)
            except FenceError as exc:
                problem = problem or str(exc)
            os.close(fd)
        self.saved = []
        if problem:
            raise Unavailable(f"cannot leave the agent's namespaces: {problem}")

    def end(self) -> None:
        """Once PID 1 has ended: stop the proxy relay, if any."""
        _stop_relay(self.relay)
        self.relay = 0


def enter_step(spec: SandboxSpec) -> StepNamespaces:
    """In the supervisor, before it forks the step's PID 1: unshare the
    step's namespaces here (its network namespace first when behind the
    proxy, with the relay to the daemon's proxy forked in it but outside the
    new PID namespace, as _run does). The descriptors kept to come back are
    close-on-exec, and the fork's worker side closes them before anything
    runs, so PID 1 never holds the host's namespaces."""
    if spec.kind != SandboxKind.NAMESPACE:
        raise InvalidArgument(f"the namespace launcher cannot run a {str(spec.kind)!r} spec")
    step = StepNamespaces()
    try:
        for name, kind in StepNamespaces._KINDS:
            step.saved.append((os.open(f"/proc/self/ns/{name}", os.O_RDONLY | os.O_CLOEXEC),
                               kind))  # fmt: skip
    except OSError as exc:
        step.leave()
        raise Unavailable(f"cannot build the namespace fence: {exc}") from exc
    try:
        step.relay = _unshare_fence(spec)
    except Unavailable:
        step.leave()
        raise
    return step


def run_as_pid1(
    spec: SandboxSpec, *, workdir_fd: int | None = None,
    ready: Callable[[], None] | None = None,
) -> NoReturn:
    """In the first child forked after enter_step, which is PID 1 of the
    step's PID namespace: build the fence and exec the command (through
    catatonit where there is one). Its parent (the supervisor) waits for it
    and reads its status as the worker's; a failure to build is said on
    stderr, as the worker said it, and ends with 127. The scratch tmpfs
    must be mounted already (scratch.enter, by the supervisor)."""
    global _report_prefix
    _report_prefix = "leviath: could not start the agent: cannot build the namespace fence: "
    report = fcntl.fcntl(2, fcntl.F_DUPFD_CLOEXEC, 3)
    if spec.kind != SandboxKind.NAMESPACE or os.getpid() != 1:
        _fail(report, "not PID 1 of a new PID namespace (enter_step first)")
    _pid1(spec, report, workdir_fd, ready=ready)


def _start_relay(spec: SandboxSpec) -> int:
    from leviathd.sandbox import forwarder

    path = os.path.join(runtime_dir(), "agents", spec.execution_id, forwarder.SOCKET_NAME)
    sock = forwarder.listen()
    try:
        return forwarder.start(sock, path, spec.uid, spec.gid, spec.groups)
    finally:
        sock.close()


def _stop_relay(pid: int) -> None:
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _run_pid1(
    spec: SandboxSpec, workdir_fd: int | None, ready: Callable[[], None] | None = None
) -> int:

    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # PID 1 of the new PID namespace
        os.close(rfd)
        _pid1(spec, wfd, workdir_fd, ready=ready)  # never returns
    os.close(wfd)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    previous = {
        sig: signal.signal(sig, forward)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    }
    try:
        report = _read_all(rfd)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(rfd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if report:
        raise Unavailable(f"cannot build the namespace fence: {report.decode(errors='replace')}")
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


# --- PID 1 ------------------------------------------------------------------


# run_as_pid1: PID 1 reports on stderr itself, in the words the worker used.
_report_prefix = ""


def _fail(wfd: int, message: str) -> NoReturn:
    if _report_prefix:
        message = f"{_report_prefix}{message}\n"
    with contextlib.suppress(OSError):
        os.write(wfd, message.encode(errors="replace")[:4000])
    os._exit(127)


INIT_CANDIDATES = ("/usr/bin/catatonit", "/usr/libexec/podman/catatonit")
_MAX_INIT_BYTES = 16 << 20
_MFD_EXEC = 0x10  # kernels with vm.memfd_noexec want it said; older ones refuse it


# PID 1 of a start()ed agent: dash runs the command as its one job (it reaps
# every other child while it waits, as an init must), keeps the exit record
# from it, and writes the status there: 128+N when a signal N ended it. A
# signal from outside does not reach it (PID 1 without a handler), so `lev
# stop` still leaves the record; ~120 KB where a Python supervisor held MBs.
# `exec` in a subshell runs the command from PATH as execvp would, never a
# dash builtin of that name (`echo -e` stays coreutils'). PATH is reset
# before printf: a PATH with dash's `%builtin` in it would look for printf
# in the user's folders first, and run her program with the record open.
SHELL_CANDIDATES = ("/usr/bin/dash", "/bin/dash")
EXIT_FD = 9
# network = "proxy": the listening socket of 127.0.0.1:3128 in the agent's
# network namespace, which PID 1 keeps for the daemon (forwarder.take_listener).
LISTEN_FD = 8
# An attached agent whose output the daemon copies: PID 1 keeps the read
# ends of its stdout and stderr pipes, so the pipes outlive a daemon restart
# and the new daemon takes them again (agents/output.py).
OUT_KEEP_FD = 7
ERR_KEEP_FD = 6
RECORDER_SCRIPT = (f'(exec "$@") {EXIT_FD}>&- {LISTEN_FD}>&- {OUT_KEEP_FD}>&- {ERR_KEEP_FD}>&-; '
                   f's=$?; PATH=/; '
                   f'printf \'{{"exit_status": %d}}\\n\' "$s" >&{EXIT_FD}')


def sealed_shell() -> int | None:
    """A sealed copy of dash, as _sealed_init makes of catatonit: PID 1
    holds the exit record's descriptor, which the agent (same uid) must not
    reach through /proc/1/fd or ptrace."""
    return _sealed_init(SHELL_CANDIDATES)


_shared: dict[tuple[str, ...], tuple[tuple[int, int, int, int], int]] = {}
# The daemon's sealed catatonit (shared_sealed(INIT_CANDIDATES)), inherited
# by a supervisor's worker: PID 1 runs it rather than make a copy of its own
# (700 KB of memory per agent and a read of the file per start).
shared_init: int | None = None


def shared_sealed(candidates: tuple[str, ...]) -> int | None:
    """In the daemon: one sealed copy for every agent (forks inherit the
    descriptor), not one each: its pages are then shared between all the
    PID 1s that run it (less PSS), and it is held once, not per agent
    (dash 125 KB, catatonit 700 KB). Sealed, nobody can change it; made
    again when the host's file changes (an upgrade)."""
    for path in candidates:
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        held = _shared.get(candidates)
        if held is not None and held[0] == key:
            return held[1]
        fd = _sealed_init((path,))
        if fd is None:
            return None
        if held is not None:
            os.close(held[1])  # forks made before keep their own copy of it
        _shared[candidates] = (key, fd)
        return fd
    return None


def _sealed_init(candidates: tuple[str, ...] = INIT_CANDIDATES) -> int | None:
    """A sealed copy of the host's catatonit in a memfd, root's, mode 0711.
    The agent's user may exec it but not read it, so the kernel makes the
    process non-dumpable at exec: the agent (same uid) cannot ptrace or
    freeze its PID 1, nor open /proc/1/exe or /proc/1/mem. (Run from the
    host's file, which anyone may read, PID 1 would be dumpable.)"""
    for path in candidates:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
                continue  # not a system file: not run as anyone's PID 1
            data = os.read(fd, _MAX_INIT_BYTES)
        finally:
            os.close(fd)
        flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
        try:
            mfd = os.memfd_create("leviath-init", flags | _MFD_EXEC)
        except OSError:
            mfd = os.memfd_create("leviath-init", flags)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(mfd, view) :]
            os.fchmod(mfd, 0o711)
            fcntl.fcntl(mfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK
                        | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)  # fmt: skip
        except OSError:
            os.close(mfd)
            return None
        return mfd
    return None


def _command_missing(argv0: str, env: dict[str, str]) -> int:
    """0 when execvp would find argv0 (as the agent's user, in its PATH);
    else the status a shell gives: 127 not found, 126 not executable. Asked
    before catatonit runs the command, which would say only 1."""
    if "/" in argv0:
        candidates = [argv0]
    else:  # an empty PATH entry is the current folder, as for execvp
        folders = env.get("PATH", os.defpath).split(":")
        candidates = [posixpath.join(folder or ".", argv0) for folder in folders]
    found = False
    for path in candidates:
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return 0
            found = True
    return 126 if found else 127


def _pid1(
    spec: SandboxSpec, wfd: int, workdir_fd: int | None,
    recorder: tuple[int, int, int] | None = None, ready: Callable[[], None] | None = None,
    kept: tuple[int, int] | None = None,
) -> NoReturn:
    """`recorder`: (sealed shell, exit record fd, proxy listener or -1) for
    start(); then nothing
    ties PID 1 to its parent, which does not wait for it."""
    init: int | None = None
    if recorder is not None:
        # Its parent ignores `lev stop`'s SIGTERM to finish the handover;
        # this process must not, or a stop while the fence is built would
        # leave the command to start afterwards (its parent records how
        # this one ended).
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
    try:
        if recorder is None:
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            # Read from the host's root, before the fence's is built.
            try:
                init = shared_init if shared_init is not None else _sealed_init()
            except OSError:
                init = None
        unshare(CLONE_NEWNS)
        # Nothing mounted from here on may propagate back to the host.
        mount(None, "/", None, MS_REC | MS_PRIVATE, None)
        _build_root(spec, workdir_fd)
        if workdir_fd is not None:
            os.close(workdir_fd)
        if ready is not None:
            ready()
    except (FenceError, OSError, Unavailable) as exc:
        _fail(wfd, str(exc))
    except BaseException as exc:  # anything at all: report it, never fall through
        _fail(wfd, f"{type(exc).__name__}: {exc}")

    if recorder is not None:
        _agent(spec, wfd, recorder[0], exit_fd=recorder[1],
               listener=recorder[2], kept=kept)  # never returns
    if init is not None:
        _agent(spec, wfd, init)  # never returns
    agent = os.fork()
    if agent == 0:
        _agent(spec, wfd)  # never returns
    os.close(wfd)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                signal.SIGUSR2):
        signal.signal(sig, forward)
    code = 1
    try:
        drop_to_user(spec.uid, spec.gid, spec.groups, no_new_privs=True)
        # A change of credentials clears the parent-death signal: set it again,
        # so that killing the launcher takes the whole namespace down.
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == agent:
                code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else (
                    os.waitstatus_to_exitcode(status)
                )
                break
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent, signal.SIGKILL)
    # Leaving kills whatever the agent left behind: PID 1 takes its namespace with it.
    os._exit(code)


def _agent(
    spec: SandboxSpec, wfd: int, init: int | None = None, exit_fd: int | None = None,
    listener: int = -1, kept: tuple[int, int] | None = None, new_session: bool = True,
) -> NoReturn:
    """Prepare and exec the agent's command; with `init`, this is PID 1 and
    execs init with the command (init forks and execs it, as this user,
    under the same filter, in this session). With `exit_fd`, `init` is the
    sealed shell, which runs the command and writes its status there.
    `new_session` False (sandbox/join.py): the command stays in the caller's
    session, which has no terminal, and in its group, which the daemon kills."""
    try:
        if new_session:
            os.setsid()
        drop_to_user(spec.uid, spec.gid, spec.groups, no_new_privs=True, real_gid=spec.real_gid)
        if init is not None and exit_fd is None:
            # As PID 1: the change of credentials cleared the parent-death
            # signal; killing the launcher must still end the namespace.
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.chdir(spec.workdir)
        seccomp.install(allow_io_uring=spec.allow_io_uring)
        for sig in (signal.SIGPIPE, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                    signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        if exit_fd is not None:
            # The shell names them by a single digit; nothing else may sit there.
            fixed = (EXIT_FD, LISTEN_FD, OUT_KEEP_FD, ERR_KEEP_FD)
            if wfd in fixed:
                wfd = fcntl.fcntl(wfd, fcntl.F_DUPFD_CLOEXEC, 10)
            if init in fixed:
                init = fcntl.fcntl(init, fcntl.F_DUPFD_CLOEXEC, 10)
            if exit_fd in fixed[1:]:
                exit_fd = fcntl.fcntl(exit_fd, fcntl.F_DUPFD_CLOEXEC, 10)
            if listener >= 0 and listener in fixed[2:]:
                listener = fcntl.fcntl(listener, fcntl.F_DUPFD_CLOEXEC, 10)
            if kept is not None:
                kept = (fcntl.fcntl(kept[0], fcntl.F_DUPFD_CLOEXEC, 10),
                        fcntl.fcntl(kept[1], fcntl.F_DUPFD_CLOEXEC, 10))
            if listener >= 0 and listener != LISTEN_FD:
                os.dup2(listener, LISTEN_FD)
            os.dup2(exit_fd, EXIT_FD)
            if kept is not None:
                os.dup2(kept[0], OUT_KEEP_FD)
                os.dup2(kept[1], ERR_KEEP_FD)
        keep = sorted({wfd} | ({init} if init is not None else set())
                      | ({EXIT_FD} if exit_fd is not None else set())
                      | ({LISTEN_FD} if listener >= 0 else set())
                      | ({OUT_KEEP_FD, ERR_KEEP_FD} if kept is not None else set()))
        low = 3
        for fd in keep:
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 65536)
    except BaseException as exc:
        _fail(wfd, f"preparing the agent: {exc}")
    os.close(wfd)
    try:
        if init is not None:
            missing = _command_missing(spec.argv[0], dict(spec.env))
            if missing:
                raise OSError(errno.ENOENT if missing == 127 else errno.EACCES,
                              os.strerror(errno.ENOENT if missing == 127 else errno.EACCES))
            if exit_fd is not None:
                os.execve(init, ["sh", "-c", RECORDER_SCRIPT, "leviath", *spec.argv],
                          dict(spec.env))
            # PR_SET_PDEATHSIG survives this exec (init is not set-uid): the
            # launcher's death still takes the namespace down.
            os.execve(init, ["catatonit", "--", *spec.argv], dict(spec.env))
        os.execvpe(spec.argv[0], list(spec.argv), dict(spec.env))
    except OSError as exc:
        print(f"leviathd: cannot run {spec.argv[0]}: {exc.strerror}", file=sys.stderr)
        os._exit(127 if exc.errno == errno.ENOENT else 126)


# --- building the root --------------------------------------------------------


def _proc_fd(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


class _Pinner:
    """O_PATH descriptors for every source, checked: mounting from the
    descriptor means a link swapped in after the check cannot change what
    gets mounted.

    - Scratch folders are opened beneath the root of the scratch tmpfs, one
      component at a time, never through a link (no user can reach them).
    - The workdir must be the very folder the user's own open gave (sandbox/supervisor.py).
    - The system folders are opened as root; everything else with the
      user's file-system ids: a bind made by root would otherwise carry the
      user past folders they cannot enter (a link from ~/.cache/pip into a
      0700 folder of someone else's).
    Every source outside scratch must really be the path the spec was computed
    for (its masks were), must not lie inside a hidden path, and a workdir or
    git folder must not hold a home."""

    def __init__(self, spec: SandboxSpec, scratch_root: int, workdir_fd: int | None) -> None:
        self.spec = spec
        self.scratch_root = scratch_root
        self.workdir_fd = workdir_fd

    def layer(self, path: str) -> int:
        return self._beneath_scratch(path, os.O_PATH | os.O_DIRECTORY)

    def _beneath_scratch(self, path: str, flags: int) -> int:
        rel = posixpath.relpath(path, self.spec.scratch)
        try:
            return scratch.open_beneath(self.scratch_root, rel, flags)
        except (OSError, Unavailable) as exc:
            raise FenceError(f"cannot open {path} in scratch: {exc}") from exc

    def source(self, m: Mount) -> int:
        spec = self.spec
        if is_within(m.source, spec.scratch):
            return self._beneath_scratch(m.source, os.O_PATH)
        fd = self._open(m.source, exact=m.exact)
        try:
            if (self.workdir_fd is not None and m.target == spec.workdir
                    and m.role == MountRole.WORKDIR):
                self._same_as_pinned(fd, m.source)
            self._check(fd, m)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _same_as_pinned(self, fd: int, path: str) -> None:
        """The pinned workdir lives in the daemon's mount namespace, which the
        kernel will not bind from here; so the workdir is opened again and
        must be that very folder (a folder has one inode, and no user can
        make a mount)."""
        assert self.workdir_fd is not None
        now, pinned = os.fstat(fd), os.fstat(self.workdir_fd)
        if (now.st_dev, now.st_ino) != (pinned.st_dev, pinned.st_ino):
            raise FenceError(f"the workdir {path} was replaced while the agent was starting")

    def _open(self, path: str, *, exact: bool) -> int:
        spec = self.spec
        flags = os.O_PATH | os.O_CLOEXEC | (os.O_NOFOLLOW if exact else 0)
        as_user = not any(is_within(path, system) for system in SYSTEM_DIRS + SYSTEM_LINK_DIRS)
        try:
            with _as_user(spec, as_user):
                return os.open(path, flags)
        except OSError as exc:
            who = f"uid {spec.uid}" if as_user else "root"
            raise FenceError(f"cannot open {path} (as {who}): {exc.strerror}") from exc

    def _check(self, fd: int, m: Mount) -> None:
        spec = self.spec
        real = os.readlink(_proc_fd(fd))
        if real != m.source:
            raise FenceError(f"{m.source} changed while the agent was starting (it is now {real})")
        if not m.exact:
            for hidden in spec.hidden:
                if is_within(real, hidden):
                    raise FenceError(f"{m.source} leads to {real}, inside the hidden path {hidden}")
        if m.role in (MountRole.WORKDIR, MountRole.WORKTREE_GIT) and (
            real == "/" or is_within(spec.home, real)
        ):
            raise FenceError(f"{real} would show the whole home folder")
        if m.role == MountRole.WORKTREE_GIT:
            self._check_git_folder(fd, real)

    def _check_git_folder(self, fd: int, real: str) -> None:
        """What the spec believed of a main git folder, checked again on the
        folder that will be mounted, as the user."""
        with _as_user(self.spec, True):
            for name, want in (("HEAD", stat.S_ISREG), ("objects", stat.S_ISDIR),
                               ("refs", stat.S_ISDIR)):  # fmt: skip
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError as exc:
                    why = f"{name}: {exc.strerror}"
                    raise FenceError(f"{real} is not a git folder ({why})") from exc
                if not want(st.st_mode):
                    raise FenceError(f"{real} is not a git folder ({name})")


@contextlib.contextmanager
def _as_user(spec: SandboxSpec, active: bool) -> Iterator[None]:
    """Make files with the user's file-system ids, so links planted in the
    user's own folders only reach what the user could reach anyway."""
    if not active:
        yield
        return
    with fsids.as_user(spec.uid, spec.gid):
        yield


class _Root:
    def __init__(self, spec: SandboxSpec, host_mounts: list[tuple[str, str]] | None) -> None:
        self.spec = spec
        # (mount point, per-mount options) of the host; None: mount_setattr
        # locks each bind's whole tree without it.
        self.host_mounts = host_mounts
        self.mounted: list[str] = []  # targets inside the new root, in order

    def host(self, target: str) -> str:
        return _BASE + target if target != "/" else _BASE

    def _on_our_tmpfs(self, target: str) -> bool:
        return not any(is_within(target, m) for m in self.mounted)

    def make(self, target: str, *, is_dir: bool) -> None:
        """Create the mount point `target` (and its parents) in the new root."""
        parts = [p for p in target.split("/") if p]
        current = ""
        for i, part in enumerate(parts):
            current += "/" + part
            path = self.host(current)
            last = i == len(parts) - 1
            with _as_user(self.spec, not self._on_our_tmpfs(current)):
                try:
                    if last and not is_dir:
                        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_WRONLY
                                         | os.O_CLOEXEC, 0o644))
                    else:
                        os.mkdir(path, 0o755)
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise FenceError(f"cannot make mount point {current}: {exc.strerror}") from exc

    def target_fd(self, target: str) -> int:
        """An O_PATH descriptor on the mount point, refused if any part of the
        way there was a link (the kernel would otherwise follow it)."""
        path = self.host(target)
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        real = os.readlink(_proc_fd(fd))
        if real != path:
            os.close(fd)
            raise FenceError(f"mount point {target} was redirected to {real}")
        return fd

    def lock_flags(self, target: str, real_source: str, readonly: bool) -> None:
        """Make a bind of `real_source` at `target`, and every mount it
        brought along, nosuid and nodev, and read-only when asked: one
        recursive mount_setattr, which keeps what each mount had already
        (noexec, read-only). Without it (kernel < 5.12), one remount per
        mount, from the host's mount table read once before the build."""
        host = self.host(target)
        if self.host_mounts is None:
            attr = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (MOUNT_ATTR_RDONLY if readonly else 0)
            if setattr_recursive(host, attr):
                return
            raise FenceError("mount_setattr went away while the fence was built")
        flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | (MS_RDONLY if readonly else 0)
        owner = max(
            (p for p in self.host_mounts if is_within(real_source, p[0])),
            key=lambda p: len(p[0]),
            default=("/", ""),
        )
        # Beneath a source of "/" every mount point is; the slice keeps its "/".
        cut = 0 if real_source == "/" else len(real_source)
        points = [(host, owner[1])] + [
            (host.rstrip("/") + point[cut:], options)
            for point, options in self.host_mounts
            if point != real_source and is_within(point, real_source)
        ]
        for point, options in points:
            extra = MS_NOEXEC if "noexec" in options.split(",") else 0
            mount(None, point, None, flags | extra, None)

    def bind(self, m: Mount, src: int) -> None:
        is_dir = stat.S_ISDIR(os.fstat(src).st_mode)
        real = os.readlink(_proc_fd(src))
        self.make(m.target, is_dir=is_dir)
        dst = self.target_fd(m.target)
        try:
            mount(_proc_fd(src), _proc_fd(dst), None, MS_BIND | MS_REC, None)
        finally:
            os.close(dst)
        self.lock_flags(m.target, real, m.readonly)
        self.mounted.append(m.target)

    def overlay(self, m: Mount, fds: list[int]) -> None:
        # The merged folder's top takes the upper folder's owner and mode:
        # give it the lower folder's (upper is root's, beneath root's tmpfs).
        below = os.fstat(fds[0])
        top = os.open(_proc_fd(fds[1]), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fchown(top, below.st_uid, below.st_gid)
            os.fchmod(top, stat.S_IMODE(below.st_mode))
        finally:
            os.close(top)
        self.make(m.target, is_dir=True)
        dst = self.target_fd(m.target)
        lower, upper, work = (_proc_fd(fd) for fd in fds)
        try:
            mount(
                "overlay",
                _proc_fd(dst),
                "overlay",
                MS_NOSUID | MS_NODEV,
                f"lowerdir={lower},upperdir={upper},workdir={work}",
            )
        finally:
            os.close(dst)
        self.mounted.append(m.target)

    def mask(self, m: Mount, null_fd: int) -> None:
        path = self.host(m.target)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            return  # a link resolves inside the new root, where its target is absent
        dst = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if stat.S_ISDIR(st.st_mode):
                mount("tmpfs", _proc_fd(dst), "tmpfs",
                      MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=000,size=4k")
            else:
                # /dev/null on a nodev mount: it cannot even be opened.
                mount(_proc_fd(null_fd), _proc_fd(dst), None, MS_BIND, None)
                mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
                      | MS_NOEXEC, None)
        finally:
            os.close(dst)

    def dev(self, target: str, nodes: dict[str, int]) -> None:
        self.make(target, is_dir=True)
        host = self.host(target)
        mount("tmpfs", host, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
        for name, fd in nodes.items():
            node = f"{host}/{name}"
            os.close(os.open(node, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o666))
            mount(_proc_fd(fd), node, None, MS_BIND, None)
            if self.host_mounts is not None:
                mount(None, node, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NOEXEC, None)
        if self.host_mounts is None:
            # Every node at once (devpts and shm, mounted below, have their own).
            setattr_recursive(host, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC)
        os.mkdir(f"{host}/pts", 0o755)
        mount("devpts", f"{host}/pts", "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=620")
        os.symlink("pts/ptmx", f"{host}/ptmx")
        os.mkdir(f"{host}/shm", 0o1777)
        mount("tmpfs", f"{host}/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777{self.size}")
        for name, link in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                           ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
            os.symlink(link, f"{host}/{name}")
        mount(None, host, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
        self.mounted.append(target)

    def proc(self, target: str) -> None:
        self.make(target, is_dir=True)
        mount("proc", self.host(target), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        self.mounted.append(target)

    def tmpfs(self, target: str) -> None:
        # The user's own, empty and seen by nothing outside this fence: the
        # private home and working folder of a credential command.
        self.make(target, is_dir=True)
        spec = self.spec
        mount("tmpfs", self.host(target), "tmpfs", MS_NOSUID | MS_NODEV,
              f"mode=700,uid={spec.uid},gid={spec.gid}{self.size or ',size=64m'}")
        self.mounted.append(target)

    @property
    def size(self) -> str:
        """`,size=` of the agent's own tmpfs mounts: from its memory limit."""
        size = resource_defaults.tmpfs_size(self.spec.limits)
        return "" if size is None else f",size={size}"

    def symlink(self, m: Mount) -> None:
        self.make(posixpath.dirname(m.target), is_dir=True)
        os.symlink(m.source, self.host(m.target))


def _mount_table() -> list[tuple[str, str]]:
    """(mount point, per-mount options) of every mount this process sees."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            found.append((fields[4].encode().decode("unicode_escape"), fields[5]))
    return found


def _build_root(spec: SandboxSpec, workdir_fd: int | None = None) -> None:
    # Pin every source (and the device nodes) while the host's view is still
    # in place: the base tmpfs below covers the host's /tmp in this namespace.
    nodes = {name: os.open(f"/dev/{name}", os.O_PATH | os.O_CLOEXEC) for name in _DEV_NODES}
    scratch_root = scratch.open_mounted(spec)
    if scratch_root is None:
        raise FenceError(f"the scratch tmpfs is not mounted on {spec.scratch}")
    pin = _Pinner(spec, scratch_root, workdir_fd)
    pins: dict[int, list[int]] = {}
    try:
        for i, m in enumerate(spec.mounts):
            if m.kind == "bind":
                pins[i] = [pin.source(m)]
            elif m.kind == "overlay":
                pins[i] = [pin.source(m), pin.layer(m.upper), pin.layer(m.work)]
    finally:
        os.close(scratch_root)
    root = _Root(spec, None if HAVE_MOUNT_SETATTR else _mount_table())
    mount("tmpfs", _BASE, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    for i, m in enumerate(spec.mounts):
        if m.kind == "bind":
            root.bind(m, pins[i][0])
        elif m.kind == "overlay":
            root.overlay(m, pins[i])
        elif m.kind == "proc":
            root.proc(m.target)
        elif m.kind == "dev":
            root.dev(m.target, nodes)
        elif m.kind == "tmpfs":
            root.tmpfs(m.target)
        elif m.kind == "symlink":
            root.symlink(m)
        elif m.kind == "mask":
            root.mask(m, nodes["null"])
        elif m.kind == "protect":
            pass  # in the finished view, below
        else:
            raise FenceError(f"unknown mount kind {m.kind!r}")
    for fds in pins.values():
        for fd in fds:
            os.close(fd)
    for fd in nodes.values():
        os.close(fd)
    # Mount points for the workdir's parents were made on the root tmpfs; from
    # now on nothing may write there.
    mount(None, _BASE, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=755")
    os.chdir(_BASE)
    pivot_root(".", ".")
    # The old root is stacked on the new one; detach it, and with it the host.
    umount2(".", MNT_DETACH)
    os.chdir("/")
    # Last, where links resolve as the agent will see them.
    guard.apply(spec)


# --- can it be built here? ----------------------------------------------------


def probe() -> str | None:
    """Why the namespace fence cannot be built on this host, or None if it can.

    Tries the real thing in a throwaway child: unshare every namespace, make /
    private, mount a tmpfs and a fresh /proc in a new PID namespace.
    """
    if os.geteuid() != 0:
        return "the namespace fence needs root"
    if platform.machine() not in _PIVOT_ROOT:
        return f"pivot_root is not known on {platform.machine()}"
    try:
        with open("/proc/filesystems") as f:
            filesystems = f.read()
    except OSError as exc:
        return f"cannot read /proc/filesystems: {exc}"
    for fs in ("tmpfs", "proc", "devpts", "overlay"):
        if f"\t{fs}\n" not in filesystems:
            return f"the kernel has no {fs} file system"
    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        try:
            unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET)
            mount(None, "/", None, MS_REC | MS_PRIVATE, None)
            _loopback_up()
            inner = os.fork()
            if inner == 0:
                try:
                    mount("tmpfs", _BASE, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
                    os.mkdir(_BASE + "/proc")
                    mount("proc", _BASE + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
                except BaseException as exc:
                    _fail(wfd, str(exc))
                os._exit(0)
            _, status = os.waitpid(inner, 0)
            os._exit(os.waitstatus_to_exitcode(status))
        except BaseException as exc:
            _fail(wfd, str(exc))
    os.close(wfd)
    try:
        report = _read_all(rfd)
    finally:
        os.close(rfd)
    _, status = os.waitpid(pid, 0)
    if report:
        return report.decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        return f"the probe ended with status {os.waitstatus_to_exitcode(status)}"
    return None
