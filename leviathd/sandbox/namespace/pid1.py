"""PID 1 of a namespace fence and the agent it starts: PID 1 builds the root
(sandbox/namespace/root.py), then runs the command through the sealed
catatonit or dash (sandbox/namespace/sealed.py), or forks it and reaps;
the agent drops to the user, takes the seccomp filter and execs. What goes
wrong before the exec is written to the parent's report pipe (fail)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import posixpath
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from leviathd.domain.sandbox import SandboxKind
from leviathd.errors import Unavailable
from leviathd.sandbox import seccomp
from leviathd.sandbox.namespace import sealed
from leviathd.sandbox.namespace.root import build_root
from leviathd.sandbox.namespace.sealed import (
    ERR_KEEP_FD,
    EXIT_FD,
    LISTEN_FD,
    OUT_KEEP_FD,
    RECORDER_SCRIPT,
    sealed_init,
)
from leviathd.sandbox.namespace.syscalls import (
    CLONE_NEWNS,
    MS_PRIVATE,
    MS_REC,
    FenceError,
    kill_with_parent,
    mount,
    unshare,
)
from leviathd.sandbox.privileges import drop_to_user
from leviathd.sandbox.spec import SandboxSpec

# Built in the daemon, which every fence's PID 1 is a fork of: no Python
# work of making them between the fork and the command (issue 18).
seccomp.prepare(allow_io_uring=False)
seccomp.prepare(allow_io_uring=True)


def read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


# --- PID 1 ------------------------------------------------------------------


# run_as_pid1: PID 1 reports on stderr itself, in the words the worker used.
_report_prefix = ""


def fail(wfd: int, message: str) -> NoReturn:
    if _report_prefix:
        message = f"{_report_prefix}{message}\n"
    with contextlib.suppress(OSError):
        os.write(wfd, message.encode(errors="replace")[:4000])
    os._exit(127)


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
        fail(report, "not PID 1 of a new PID namespace (enter_step first)")
    main(spec, report, workdir_fd, ready=ready)


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


def main(
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
            kill_with_parent()
            # Read from the host's root, before the fence's is built.
            try:
                init = sealed.shared_init if sealed.shared_init is not None else sealed_init()
            except OSError:
                init = None
        unshare(CLONE_NEWNS)
        # Nothing mounted from here on may propagate back to the host.
        mount(None, "/", None, MS_REC | MS_PRIVATE, None)
        build_root(spec, workdir_fd)
        if workdir_fd is not None:
            os.close(workdir_fd)
        if ready is not None:
            ready()
    except (FenceError, OSError, Unavailable) as exc:
        fail(wfd, str(exc))
    except BaseException as exc:  # anything at all: report it, never fall through
        fail(wfd, f"{type(exc).__name__}: {exc}")

    if recorder is not None:
        exec_agent(spec, wfd, recorder[0], exit_fd=recorder[1],
               listener=recorder[2], kept=kept)  # never returns
    if init is not None:
        exec_agent(spec, wfd, init)  # never returns
    agent = os.fork()
    if agent == 0:
        exec_agent(spec, wfd)  # never returns
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
        kill_with_parent()
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


def exec_agent(
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
            kill_with_parent()
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
        fail(wfd, f"preparing the agent: {exc}")
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
