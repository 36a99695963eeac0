"""The `none` launcher: no fence, only the user's identity, a new session and
the scrubbed environment. Used for `kind = "none"` and for runs that
`on_unavailable = "warn"` sent to the host."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal

from leviathd.errors import Unavailable
from leviathd.sandbox.namespace import sealed
from leviathd.sandbox.privileges import drop_to_user
from leviathd.sandbox.spec import SandboxSpec


def run(spec: SandboxSpec) -> int:
    """Exec the command in place: the caller's process becomes the agent, so
    its exit status is the agent's."""
    # A new session: the agent cannot push input into a terminal it came from.
    if os.getpid() != os.getsid(0):
        os.setsid()
    os.chdir(spec.workdir)
    # real_gid is set for a credential command (creds/fence.py), which
    # gets no_new_privs as every command started for a user outside an agent.
    guarded = spec.real_gid is not None
    drop_to_user(spec.uid, spec.gid, spec.groups, no_new_privs=guarded, real_gid=spec.real_gid)
    try:
        os.execvpe(spec.argv[0], list(spec.argv), dict(spec.env))
    except OSError as exc:
        os.write(2, f"leviath: cannot run {spec.argv[0]!r}: {exc.strerror}\n".encode())
        return 127


# The signals the daemon's fork ignores (Python's, and the handover's own
# against `lev stop`) that an exec'd program must get back: dash cannot trap
# a signal ignored when it starts, and the command would inherit them.
_RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGHUP, signal.SIGINT,
                  signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# Not PID 1 of a namespace, so nothing shields the recorder from `lev
# stop`'s SIGTERM (sent to the whole scope): a trap (a handler, which exec
# resets to the default for the command) keeps it alive until the command
# has ended, and it records 128+15 as the namespace's PID 1 does.
RECORDER_SCRIPT = "trap : TERM HUP INT; " + sealed.RECORDER_SCRIPT


def start(
    spec: SandboxSpec, *, exit_fd: int, shell: int | None, kept: tuple[int, int] | None = None,
) -> int:
    """For a one-command agent (supervisor._hand_over): start the sealed
    dash (root's memfd, exec-only for the user, so the kernel makes it
    non-dumpable: she cannot ptrace it nor read its descriptors) as the
    user, with exactly run()'s identity, session, folder and environment;
    it runs the command and writes its status to `exit_fd`. Return its pid
    without waiting. `kept`: the attached output pipes' read ends, which it
    holds at sealed.OUT_KEEP_FD/ERR_KEEP_FD for the daemon."""
    if shell is None:
        shell = sealed.sealed_shell()
    if shell is None:
        raise Unavailable("no shell to record the exit status (/usr/bin/dash)")
    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the recorder
        try:
            _recorder(spec, wfd, shell, exit_fd, kept)
        except BaseException as exc:  # anything at all: report it, never fall through
            with contextlib.suppress(OSError):
                os.write(wfd, f"{type(exc).__name__}: {exc}".encode(errors="replace")[:4000])
        os._exit(127)
    os.close(wfd)
    try:
        report = b""
        while chunk := os.read(rfd, 4096):
            report += chunk[: 4096 - len(report)]
    finally:
        os.close(rfd)
    if report:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        raise Unavailable(report.decode(errors="replace"))
    return pid


def _recorder(
    spec: SandboxSpec, wfd: int, shell: int, exit_fd: int, kept: tuple[int, int] | None,
) -> None:
    os.setsid()
    os.chdir(spec.workdir)
    guarded = spec.real_gid is not None
    drop_to_user(spec.uid, spec.gid, spec.groups, no_new_privs=guarded, real_gid=spec.real_gid)
    for sig in _RESET_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    # (Its OOM score is 0 already: _hand_over set it while still root.)
    # dash names them by one digit: move whatever sits there out of the way first.
    fixed = (sealed.EXIT_FD, sealed.OUT_KEEP_FD, sealed.ERR_KEEP_FD)
    wfd, shell, exit_fd = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) if fd in fixed else fd
                           for fd in (wfd, shell, exit_fd))
    if kept is not None:
        kept = (fcntl.fcntl(kept[0], fcntl.F_DUPFD_CLOEXEC, 10),
                fcntl.fcntl(kept[1], fcntl.F_DUPFD_CLOEXEC, 10))
        os.dup2(kept[0], sealed.OUT_KEEP_FD)
        os.dup2(kept[1], sealed.ERR_KEEP_FD)
    os.dup2(exit_fd, sealed.EXIT_FD)
    keep = {wfd, shell, sealed.EXIT_FD} | (
        {sealed.OUT_KEEP_FD, sealed.ERR_KEEP_FD} if kept is not None else set())
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)
    # The pipe closes at exec: an empty report is the daemon's "started".
    os.execve(shell, ["sh", "-c", RECORDER_SCRIPT, "leviath", *spec.argv], dict(spec.env))
