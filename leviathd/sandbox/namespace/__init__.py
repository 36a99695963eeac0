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
    sealed_init), which runs the command: PID 1 holds a few hundred KB
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
import os
import platform
import signal
import sys
from collections.abc import Callable

from leviathd.domain.sandbox import SandboxKind
from leviathd.errors import InvalidArgument, Unavailable
from leviathd.paths import runtime_dir
from leviathd.sandbox import scratch
from leviathd.sandbox.namespace import pid1
from leviathd.sandbox.namespace.pid1 import run_as_pid1 as run_as_pid1
from leviathd.sandbox.namespace.root import BASE
from leviathd.sandbox.namespace.sealed import sealed_shell
from leviathd.sandbox.namespace.syscalls import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUTS,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    FenceError,
    loopback_up,
    mount,
    pivot_root_known,
    sethostname,
    setns,
    unshare,
)
from leviathd.sandbox.spec import SandboxSpec

# --- the parent side --------------------------------------------------------


def _namespace_flags(spec: SandboxSpec) -> int:
    """The namespaces the parent unshares. The mount namespace is left to PID 1:
    pivot_root moves every process of a mount namespace, and the parent must
    keep the host's view to clean up after the agent."""
    flags = CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if not spec.network:
        flags |= CLONE_NEWNET
    return flags


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
            loopback_up()
        if spec.proxy:
            # No relay process: PID 1 keeps the proxy's listening socket
            # (closed for the command) and the daemon accepts on a copy it
            # takes from there (pidfd_getfd), again after a restart.
            from leviathd.sandbox import forwarder

            listener = forwarder.listen().detach()
        sethostname(spec.hostname)
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
        pid1.main(spec, wfd, workdir_fd, recorder=(shell, exit_fd, listener),
              ready=ready, kept=kept)  # never returns
    os.close(wfd)
    os.close(shell)
    if listener >= 0:
        os.close(listener)
    try:
        report = pid1.read_all(rfd)
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
            loopback_up()
            relay = _start_relay(spec)
            flags &= ~CLONE_NEWNET
        unshare(flags)
        if not spec.network and not spec.proxy:
            loopback_up()
        sethostname(spec.hostname)
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
        pid1.main(spec, wfd, workdir_fd, ready=ready)  # never returns
    os.close(wfd)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    previous = {
        sig: signal.signal(sig, forward)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    }
    try:
        report = pid1.read_all(rfd)
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


# --- can it be built here? ----------------------------------------------------


def probe() -> str | None:
    """Why the namespace fence cannot be built on this host, or None if it can.

    Tries the real thing in a throwaway child: unshare every namespace, make /
    private, mount a tmpfs and a fresh /proc in a new PID namespace.
    """
    if os.geteuid() != 0:
        return "the namespace fence needs root"
    if not pivot_root_known():
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
            loopback_up()
            inner = os.fork()
            if inner == 0:
                try:
                    mount("tmpfs", BASE, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
                    os.mkdir(BASE + "/proc")
                    mount("proc", BASE + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
                except BaseException as exc:
                    pid1.fail(wfd, str(exc))
                os._exit(0)
            _, status = os.waitpid(inner, 0)
            os._exit(os.waitstatus_to_exitcode(status))
        except BaseException as exc:
            pid1.fail(wfd, str(exc))
    os.close(wfd)
    try:
        report = pid1.read_all(rfd)
    finally:
        os.close(rfd)
    _, status = os.waitpid(pid, 0)
    if report:
        return report.decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        return f"the probe ended with status {os.waitstatus_to_exitcode(status)}"
    return None
