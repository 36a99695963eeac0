"""Starting an agent's first process so that it is inside its scope before it
does anything.

The daemon forks a child that (1) opens and enters the workdir as the calling
user, which proves the user can, keeps that descriptor (WORKDIR_FD) and reports
its real path, then (2) waits on a pipe while
the daemon creates the scope around it, and (3) on release, reads the sandbox
spec from that pipe and becomes the agent's supervisor: it connects the output
to the journal from inside the scope, runs the launcher in a worker, records
the exit status in the state folder, and exits. The supervisor stays root but
holds nothing an agent could use, and it ignores SIGTERM so that `lev stop`
still leaves an exit record.

The workdir descriptor is what every fence mounts: nothing opens the workdir
by path as root again, so a link swapped in after the user's open changes
nothing. Before its first namespace step the supervisor mounts the agent's
scratch tmpfs in a mount namespace of its own (sandbox/scratch.py)."""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import resource
import select
import signal
import syslog
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from leviathd import fsat
from leviathd.errors import Unavailable
from leviathd.events import Event
from leviathd.identity import UserInfo
from leviathd.sandbox import scratch
from leviathd.sandbox.launchers import RunContext, launcher
from leviathd.sandbox.spec import SandboxSpec
from leviathd.systemd import journal

if TYPE_CHECKING:
    from leviathd.sandbox.namespace import StepNamespaces

_RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def _workdir_fd() -> int:
    """Where the held child keeps the workdir it opened as the user: a fixed
    number the daemon can name (/proc/<pid>/fd/N), within the fd limit."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1000 if soft == resource.RLIM_INFINITY or soft > 1000 else max(soft - 1, 3)


WORKDIR_FD = _workdir_fd()
# Where the held child keeps its end of the daemon's hold socket
# (sandbox/fencehold.py), when the daemon asks for one: below the workdir's.
HOLD_FD = WORKDIR_FD - 1


@dataclass
class Stdio:
    """The caller's terminal, for an attached run; None for detached.
    `kept`: set when the daemon copies the output itself (agents/output.py):
    stdout and stderr are then the write ends of the daemon's pipes, and
    these are their read ends, which the agent's PID 1 keeps for a
    restarted daemon."""

    stdin: int | None = None
    stdout: int | None = None
    stderr: int | None = None
    kept: tuple[int, int] | None = None

    def fds(self) -> list[int]:
        return [fd for fd in (self.stdin, self.stdout, self.stderr, *(self.kept or ()))
                if fd is not None]


@dataclass
class Held:
    pid: int
    status_r: int
    go_w: int

    def workdir_path(self) -> str:
        """The workdir exactly as the user opened it, for a root process of
        the daemon's to open (O_PATH) or bind from while the child is held or
        supervising: never the workdir's path, which the user can change."""
        return f"/proc/{self.pid}/fd/{WORKDIR_FD}"

    def abort(self) -> None:
        """Let the child go without running anything: closing the go pipe
        makes it exit."""
        for fd in (self.go_w, self.status_r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def fork_held(
    user: UserInfo, workdir: str, *, exit_path: str, identifier: str, unit: str, stdio: Stdio,
    shell: int | None = None, init: int | None = None, hold: int | None = None,
    image: int | None = None,
) -> Held:
    """`shell`: the daemon's sealed copy of dash (namespace.shared_sealed),
    which an agent without a supervisor runs as PID 1; None: every agent
    gets a supervisor. `init`: the daemon's sealed copy of catatonit, which
    a supervised namespace agent's PID 1 runs (None: PID 1 makes its own).
    `hold`: the child's end of a hold socket; when the steps say `hold`, each
    fence's PID 1 waits on it for the daemon to mark its mounts before the
    command runs (sandbox/fencehold.py). `image`: an empty unnamed file for
    the agent's scratch filesystem (sandbox/loopfs.py), of which the daemon
    keeps a copy."""
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        # The daemon's objects are shared with it copy-on-write: a garbage
        # collection here would write to every one of them (their GC
        # headers) and copy the pages, megabytes per agent (issue 18).
        gc.freeze()
        code = 1
        try:
            # The daemon's descriptors (its bus connection above all) must not
            # live on in the agent's supervisor: a supervisor holding the bus
            # socket keeps a dead daemon's name owned.
            keep = {0, 1, 2, status_w, go_r, *stdio.fds()}
            _close_fds_except(keep | {fd for fd in (shell, init, hold, image) if fd is not None})
            # A daemon with many agents holds over WORKDIR_FD descriptors:
            # what we keep may sit where the workdir, or the hold socket,
            # goes next.
            status_w, go_r = _off_workdir_fd(status_w), _off_workdir_fd(go_r)
            shell = None if shell is None else _off_workdir_fd(shell)
            init = None if init is None else _off_workdir_fd(init)
            global _image
            _image = None if image is None else _off_workdir_fd(image)
            moved = [None if fd is None else _off_workdir_fd(fd)
                     for fd in (stdio.stdin, stdio.stdout, stdio.stderr)]
            stdio = Stdio(moved[0], moved[1], moved[2],
                          kept=None if stdio.kept is None else (
                              _off_workdir_fd(stdio.kept[0]), _off_workdir_fd(stdio.kept[1])))
            if hold is not None and hold != HOLD_FD:
                # With a file limit under 4 there is no room for it: the
                # steps then find no hold and refuse to start (fail closed).
                if HOLD_FD > 2:
                    os.dup2(hold, HOLD_FD, inheritable=False)
                os.close(hold)
            code = _child(user, workdir, status_w, go_r, exit_path, identifier, unit, stdio,
                          shell, init)
        except BaseException as exc:
            _complain(f"leviathd supervisor: {exc!r}")
        os._exit(code)
    os.close(status_w)
    os.close(go_r)
    return Held(pid=pid, status_r=status_r, go_w=go_w)


ENDED_EARLY = "the agent's process ended before it was ready"

# In the held child: the daemon's empty image file for the scratch (fork_held).
_image: int | None = None


def _take_image() -> int | None:
    global _image
    image, _image = _image, None
    return image


def read_status(fd: int) -> tuple[bool, str]:
    """The child's answer to the workdir check: (True, real path) or
    (False, reason)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            return False, ENDED_EARLY
        data += chunk
    text = data.decode(errors="replace").rstrip("\n")
    ok, _, rest = text.partition(" ")
    return ok == "ok", rest


def release(
    held: Held, steps: list[tuple[str, dict[str, object]]], *, hold: bool = False
) -> None:
    """Let the held process go on, handing it the steps to run: (label, the
    spec as a dict) each. `held.status_r` stays open: on it comes the
    handover (read_handover)."""
    payload = json.dumps({"steps": [{"label": lb, "spec": sp} for lb, sp in steps],
                          "hold": hold}).encode()
    view = memoryview(payload)
    while view:
        n = os.write(held.go_w, view)
        view = view[n:]
    os.close(held.go_w)


# On the status pipe after the workdir check: the held process stays on as
# the supervisor (no handover), and later that the agent's exit record is
# written (the agent has ended; our own exit follows).
SUPERVISING = b"supervise\n"
ENDED = b"ended\n"


def _say(fd: int, word: bytes) -> None:
    with contextlib.suppress(OSError):  # the daemon went away: our pid tells a new one
        os.write(fd, word)


def read_handover(data: bytes) -> int | None:
    """The pid of the agent's PID 1 from the held process's last words
    ("pid N"), when it handed the agent over and left; None when it stays
    on as the supervisor (or died)."""
    text = data[:64].decode(errors="replace")
    if not text.startswith("pid ") or not text.endswith("\n"):
        return None
    number = text[4:-1]
    return int(number) if number.isdigit() and 0 < int(number) < 1 << 22 else None


# --- the child -------------------------------------------------------------


def _enter_as_user(user: UserInfo, workdir: str) -> str:
    """Open `workdir` and enter it with the user's identity (effective ids
    only, so root can be regained); keep the descriptor at WORKDIR_FD and
    return its real path."""
    os.setgroups(list(user.groups))
    os.setegid(user.gid)
    os.seteuid(user.uid)
    try:
        fd = os.open(workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fchdir(fd)  # search permission, as the user
            os.dup2(fd, WORKDIR_FD, inheritable=False)
        finally:
            os.close(fd)
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups([])
    return os.readlink(f"/proc/self/fd/{WORKDIR_FD}")


def _child(
    user: UserInfo, workdir: str, status_w: int, go_r: int, exit_path: str,
    identifier: str, unit: str, stdio: Stdio, shell: int | None = None,
    init: int | None = None,
) -> int:
    os.setsid()
    try:
        real = _enter_as_user(user, workdir)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.EACCES, errno.EPERM):
            reason = f"{user.name} may not enter {workdir}: {reason}"
        else:
            reason = f"cannot enter workdir {workdir}: {reason}"
        os.write(status_w, f"err {reason}\n".encode())
        return 1
    os.write(status_w, f"ok {real}\n".encode())

    payload = b""
    while chunk := os.read(go_r, 65536):
        payload += chunk
    os.close(go_r)
    if not payload:
        return 1  # the daemon gave up on this agent
    message = json.loads(payload)
    steps = [
        (str(step["label"]), SandboxSpec.from_dict(step["spec"]))
        for step in message["steps"]
    ]
    if not message.get("hold"):
        with contextlib.suppress(OSError):
            os.close(HOLD_FD)
    elif _held() is None:
        _complain("leviathd supervisor: the daemon's hold is missing; not starting")
        return 1
    if shell is not None and _lean(steps, stdio):
        return _hand_over(steps[0][1], exit_path, identifier, unit, status_w, shell, stdio)
    if stdio.kept is not None:
        # The daemon checked what _lean does: this is not reached unless the
        # host changed in between (journald gone); the daemon's pipes then
        # take the caller's place and the journal gets our copy.
        for fd in stdio.kept:
            os.close(fd)
        stdio = Stdio(stdio.stdin, stdio.stdout, stdio.stderr)
    if shell is not None:
        os.close(shell)
    _say(status_w, SUPERVISING)
    return _supervise(steps, exit_path, identifier, unit, stdio, user, init, said=status_w)


def _lean(steps: list[tuple[str, SandboxSpec]], stdio: Stdio) -> bool:
    """An agent that needs no supervisor: nothing to copy to a caller, one
    step, its own namespace fence (with its proxy relay, if any, beside
    PID 1), journald there to take its output and dash to record its status
    (namespace.start)."""
    if (stdio.fds() and stdio.kept is None) or len(steps) != 1:
        return False
    return (launcher(steps[0][1].kind).start is not None
            and os.path.exists(journal.STDOUT_SOCKET))


def _hand_over(
    spec: SandboxSpec, exit_path: str, identifier: str, unit: str, status_w: int, shell: int,
    stdio: Stdio | None = None,
) -> int:
    """Start the agent and leave: its PID 1 (a sealed dash) runs the command
    and writes the exit status into the record opened here; its output goes
    straight to journald over streams connected here (root, in the scope:
    journald trusts the unit a root peer names, so the last lines of an
    agent that is already gone still file under its scope, and it takes
    the uid from whoever writes, the agent: they land in her journal).
    The daemon learns PID 1's pid on `status_w` and watches it instead of
    us; nothing of ours stays but PID 1 (issue 18).

    Attached (`stdio.kept` set): the agent's stdin is the caller's, its
    stdout and stderr the daemon's pipes, which the daemon copies to the
    journal and the caller (agents/output.py); PID 1 keeps their read ends."""
    entry = launcher(spec.kind)
    assert entry.start is not None  # _lean
    agent_id = os.path.basename(exit_path).split(".")[0]
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    # What the daemon's fork inherited and the agent must not: Python's
    # ignored SIGXFSZ (namespace.pid1.exec_agent resets the others) and the
    # daemon's OOM score (the agent's scope, not the daemon, is to blame).
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    _write_proc("/proc/self/oom_score_adj", "0")
    copied = stdio is not None and stdio.kept is not None
    try:
        if stdio is not None and stdio.kept is not None:
            j_out, j_err = stdio.stdout, stdio.stderr
            assert j_out is not None and j_err is not None
        else:
            j_out = journal.open_stream(identifier, priority=syslog.LOG_INFO, unit=unit)
            j_err = journal.open_stream(identifier, priority=syslog.LOG_WARNING, unit=unit)
        exit_fd = _open_spare_exit(agent_id)
        if entry.held.scratch_image:
            scratch.enter(spec, _take_image())
        stdin = stdio.stdin if stdio is not None else None
        null = os.open(os.devnull, os.O_RDONLY) if stdin is None else stdin
        os.dup2(null, 0)
        os.dup2(j_out, 1)
        os.dup2(j_err, 2)
        for fd in {null, j_out, j_err}:
            if fd > 2:
                os.close(fd)
        kept = stdio.kept if copied and stdio else None
        pid = entry.start(spec, workdir_fd=_pinned_workdir(), exit_fd=exit_fd, shell=shell,
                          ready=_held(), kept=kept)
    except (OSError, Unavailable) as exc:
        _complain(f"leviath: could not start the agent: {exc}")
        _write_exit(exit_path, 127)
        return 127
    early = ended_at_start(pid, exit_path)
    if early is not None:
        return early
    try:
        os.write(status_w, f"pid {pid}\n".encode())
    except OSError:
        pass  # the daemon went away: a restarted one finds PID 1 in the scope
    return 0


def ended_at_start(pid: int, exit_path: str) -> int | None:
    """PID 1 (pid) gone already, just after its start: its status, and we
    stay the one watched (the daemon sees our end); None while it runs.
    Killed before its shell ran, we record it; a command that ended this
    fast has its status in the record the shell wrote (the spare, which
    RecordStore.read_exit reads when exit_path has none). Writing the
    shell's own status here recorded 0 for `sh -c "exit 5"`."""
    from leviathd.sandbox import namespace

    early = namespace.ended_early(pid)
    if early is None:
        return None
    code, killed = early
    if killed:
        _write_exit(exit_path, code)
    return code


def _open_spare_exit(agent_id: str) -> int:
    """The exit record PID 1 writes, empty until then: in the runtime
    folder (memory), so a full state disk cannot lose it, and it outlives
    a daemon restart. RecordStore.read_exit reads it."""
    from leviathd.records import spare_exit_path

    spare = spare_exit_path(agent_id)
    runtime_fd, exits = fsat.open_parent(os.path.dirname(spare))
    try:
        fsat.mkdir_at(runtime_fd, exits, 0o700, exist_ok=True)
        exits_fd = fsat.open_dir_at(runtime_fd, exits)
    finally:
        os.close(runtime_fd)
    try:
        return os.open(os.path.basename(spare),
                       os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                       0o600, dir_fd=exits_fd)
    finally:
        os.close(exits_fd)


def _output_streams(
    user: UserInfo | None, identifier: str, unit: str, agent_id: str
) -> tuple[int, int, journal.UserStreams | None]:
    """Where the agent's stdout and stderr go: streams its user connected
    (her own journal), else root's streams (the system journal), else,
    without journald, the agent's log file."""
    if user is not None and user.uid != 0 and os.path.exists(journal.STDOUT_SOCKET):
        try:
            streams = journal.UserStreams.open(
                user.uid, user.gid,
                [(identifier, syslog.LOG_INFO), (identifier, syslog.LOG_WARNING)], unit,
            )
            return streams.fds[0], streams.fds[1], streams
        except OSError as exc:
            journal.record_after_fork(
                f"agent {agent_id}: output goes to the system journal: {exc}",
                priority=syslog.LOG_WARNING, LEVIATH_AGENT=agent_id,
            )
    j_out = journal.open_stream(
        identifier, priority=syslog.LOG_INFO, unit=unit, agent_id=agent_id
    )
    j_err = journal.open_stream(
        identifier, priority=syslog.LOG_WARNING, unit=unit, agent_id=agent_id
    )
    return j_out, j_err, None


def _supervise(
    steps: list[tuple[str, SandboxSpec]], exit_path: str, identifier: str, unit: str,
    stdio: Stdio, user: UserInfo | None = None, init: int | None = None, said: int = -1,
) -> int:
    """Run each step (seed commands, then stages or the command) in turn, in
    its own fence, stopping at the first that fails; the agent's exit status
    is the last step's. `said`: the status pipe, on which ENDED follows the
    exit record."""
    agent_id = os.path.basename(exit_path).split(".")[0]
    # We are in the scope now: journald files these streams under its unit.
    j_out, j_err, user_streams = _output_streams(user, identifier, unit, agent_id)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # When the scope runs out of memory, the agent is what should go, not the
    # process that records how it ended.
    _write_proc("/proc/self/oom_score_adj", "-1000")
    code = 0
    fenced = [spec for _label, spec in steps if launcher(spec.kind).held.scratch_image]
    if fenced:
        try:
            scratch.enter(fenced[0], _take_image())
        except (OSError, Unavailable) as exc:
            _complain(f"leviath: could not make the agent's scratch: {exc}")
            steps, code = [], 127
    for index, (label, spec) in enumerate(steps):
        _write_step(exit_path, index, label)
        if len(steps) > 1:
            journal.record_after_fork(
                f"agent {agent_id}: {label} starts", LEVIATH_AGENT=agent_id,
                LEVIATH_STEP=label, LEVIATH_EVENT=Event.STEP_START,
            )
        code = _run_step(spec, stdio, j_out, j_err, init)
        if len(steps) > 1:
            journal.record_after_fork(
                f"agent {agent_id}: {label} ended with status {code}", LEVIATH_AGENT=agent_id,
                LEVIATH_STEP=label, LEVIATH_EVENT=Event.STEP_END, LEVIATH_EXIT_STATUS=code,
            )
        if code != 0:
            break
    # The caller's descriptors go now, not at our exit: an attached `lev`
    # reads its output until they end, and ends once the agent has too. Not
    # while a writer to a slow caller is still on (its descriptor's number
    # could come back as the exit record's).
    gone = {stdio.stdin} if _CLIENT_WRITER_LEFT else {stdio.stdin, stdio.stdout, stdio.stderr}
    for fd in gone - {None, 0, 1, 2}:
        assert fd is not None
        os.close(fd)
    if user_streams is not None:
        user_streams.close()
    _write_exit(exit_path, code)
    if said >= 0:
        # The record is written and every output copied: the daemon may end
        # the agent now rather than at our exit, which (a fork of the
        # daemon, its pages shared) takes some ms to unmap (issue 18).
        _say(said, ENDED)
        os.close(said)
    return code


def _run_step(
    spec: SandboxSpec, stdio: Stdio, j_out: int, j_err: int, init: int | None = None
) -> int:
    try:
        step = _enter_step(spec)
    except Unavailable as exc:
        for fd in (j_err, stdio.stderr):
            if fd is not None:
                _write_all(fd, f"leviath: could not start the agent: {exc}\n".encode())
        return 127
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    worker = os.fork()
    if worker == 0:  # pragma: no cover - the worker
        code = 127
        try:
            stdin = stdio.stdin if stdio.stdin is not None else os.open(os.devnull, os.O_RDONLY)
            os.dup2(stdin, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            # Python ignores SIGPIPE and friends; an exec'd program must not.
            for sig in _RESET_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            _write_proc("/proc/self/oom_score_adj", "0")
            low = 3
            for fd in sorted({HOLD_FD, WORKDIR_FD} | ({init} if init is not None else set())):
                os.closerange(low, fd)
                low = fd + 1
            os.closerange(low, _max_fd())
            if init is not None and launcher(spec.kind).held.init:
                from leviathd.sandbox.namespace import sealed

                sealed.shared_init = init
            if step is not None:
                from leviathd.sandbox import namespace

                namespace.run_as_pid1(spec, workdir_fd=_pinned_workdir(), ready=_held())
            code = _launch(spec)
        except BaseException as exc:
            _complain(f"leviath: could not start the agent: {exc}")
        os._exit(code)
    os.close(out_w)
    os.close(err_w)
    left = _leave_step(step, worker)
    _copy_output({out_r: (j_out, stdio.stdout), err_r: (j_err, stdio.stderr)})
    _, wstatus = os.waitpid(worker, 0)
    if step is not None:
        step.end()
    if not left:
        return 127
    code = os.waitstatus_to_exitcode(wstatus)
    return 128 - code if code < 0 else code


def _leave_step(step: StepNamespaces | None, pid1: int) -> bool:
    """Back to our own namespaces once PID 1 is forked; when that fails,
    PID 1 is ended and no further step may run (False)."""
    if step is None:
        return True
    try:
        step.leave()
    except Unavailable as exc:
        _complain(f"leviath: {exc}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid1, signal.SIGKILL)
        return False
    return True


def _enter_step(spec: SandboxSpec) -> StepNamespaces | None:
    """A namespace step's namespaces, entered here so that the next fork is
    its PID 1, with no worker between (namespace.enter_step); None for
    other kinds."""
    enter = launcher(spec.kind).enter_step
    return enter(spec) if enter is not None else None


def _held() -> Callable[[], None] | None:
    """The fence's wait for the daemon, when the daemon asked for one (the
    hold socket is open)."""
    try:
        os.fstat(HOLD_FD)
    except OSError:
        return None
    from leviathd.sandbox import fencehold

    return fencehold.waiter(HOLD_FD)


def _pinned_workdir() -> int | None:
    """WORKDIR_FD when it is open (the launcher refuses it unless it still
    is the spec's workdir)."""
    try:
        os.fstat(WORKDIR_FD)
    except OSError:
        return None
    return WORKDIR_FD


def _complain(message: str) -> None:
    """Last words of a forked child on its stderr, which may be gone."""
    try:
        os.write(2, f"{message}\n".encode())
    except OSError:
        pass


def _write_proc(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError:
        pass


def _launch(spec: SandboxSpec) -> int:
    return launcher(spec.kind).run(spec, RunContext(workdir_fd=_pinned_workdir(), ready=_held()))


# What an attached client that does not read may fall behind by before its
# copy of the output has gaps (the journal's copy never does).
CLIENT_BACKLOG = 1 << 20
# At a step's end, how long the client's copy may take to drain before the
# supervisor goes on without it.
CLIENT_DRAIN_SECONDS = 5.0


class _ClientCopy:
    """The attached caller's copy of the output, written by a thread of its
    own: a caller that stops reading (a stopped `lev run`, a pipe nobody
    reads) blocks only that thread, never the journal's copy nor the agent.
    Its descriptors are the caller's own open files, whose O_NONBLOCK we
    must not change (the caller's shell shares them), so the writes block
    there instead of here."""

    def __init__(self) -> None:
        import collections
        import threading

        self._queue: collections.deque[tuple[int, bytes | None]] = collections.deque()
        self._queued = 0
        self._lost: dict[int, int] = {}
        self._dead: set[int] = set()
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="client-copy", daemon=True)
        self._thread.start()

    def put(self, fd: int, data: bytes) -> None:
        with self._cond:
            if fd in self._dead:
                return
            if self._queued + len(data) > CLIENT_BACKLOG:
                if fd not in self._lost:
                    self._queue.append((fd, None))  # where the gap is said
                self._lost[fd] = self._lost.get(fd, 0) + len(data)
            else:
                self._queue.append((fd, data))
                self._queued += len(data)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(CLIENT_DRAIN_SECONDS)
        if self._thread.is_alive():
            global _CLIENT_WRITER_LEFT
            _CLIENT_WRITER_LEFT = True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                fd, data = self._queue.popleft()
                if data is None:
                    lost = self._lost.pop(fd, 0)
                    data = (f"\n[leviath: {lost} bytes of output not shown here (this reader "
                            "fell behind); `lev logs` has all of it]\n").encode()
                else:
                    self._queued -= len(data)
                if fd in self._dead:
                    continue
            if not _write_all(fd, data):
                with self._cond:
                    self._dead.add(fd)


# A _ClientCopy writer outlived its close (a caller that stopped reading).
_CLIENT_WRITER_LEFT = False


def _copy_output(routes: dict[int, tuple[int, int | None]]) -> None:
    """Copy each pipe to its journal stream and, for an attached run, to the
    caller's terminal (through _ClientCopy: the journal never waits for a
    caller). A caller that went away stops getting output; the journal
    keeps it."""
    open_fds = dict(routes)
    client_copy = _ClientCopy() if any(c is not None for _j, c in routes.values()) else None
    try:
        while open_fds:
            ready, _, _ = select.select(list(open_fds), [], [])
            for fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    del open_fds[fd]
                    os.close(fd)
                    continue
                jfd, client = open_fds[fd]
                _write_all(jfd, data)
                if client is not None and client_copy is not None:
                    client_copy.put(client, data)
    finally:
        if client_copy is not None:
            client_copy.close()


def _write_all(fd: int, data: bytes) -> bool:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        return False
    return True


def step_path(exit_path: str) -> str:
    """Beside the exit record: which step runs now (RecordStore.read_step)."""
    return exit_path.removesuffix(".exit") + ".step"


def _write_step(exit_path: str, index: int, label: str) -> None:
    """Which step runs now, for the gate: policy rules see `agent.stage`, and
    the shell and blueprint tools run in this step's fence. Written by this
    process (root, in the scope), never by anything the agent runs. A state
    folder that cannot take it (full) must not leave the previous step's in
    force: the old record is removed, and the daemon then knows no stage
    (agent.stage "", the last step's fence, as before stages were told)."""
    data = json.dumps({"index": index, "label": label}).encode()
    try:
        dir_fd, name = fsat.open_parent(step_path(exit_path))
    except OSError:
        return
    try:
        fsat.atomic_write_at(dir_fd, name, data, mode=0o644)
    except OSError:
        with contextlib.suppress(OSError):
            fsat.unlink_at(dir_fd, name)
    finally:
        os.close(dir_fd)


def _write_exit(path: str, code: int) -> None:
    """The exit record, in the state folder; when that cannot be written (a
    full disk), in the runtime folder, which is memory: the daemon reads
    either (RecordStore.read_exit), so the exit status is never lost to a
    full state disk, even over a daemon restart."""
    import time

    from leviathd.records import spare_exit_path

    data = json.dumps({"exit_status": code, "ended_at": time.time()}).encode()
    try:
        dir_fd, name = fsat.open_parent(path)
    except OSError:
        dir_fd, name = -1, ""
    try:
        if dir_fd >= 0:
            fsat.atomic_write_at(dir_fd, name, data, mode=0o644)
            return
    except OSError:
        pass
    finally:
        if dir_fd >= 0:
            os.close(dir_fd)
    spare = spare_exit_path(os.path.basename(path).split(".")[0])
    runtime_fd, exits = fsat.open_parent(os.path.dirname(spare))
    try:
        fsat.mkdir_at(runtime_fd, exits, 0o700, exist_ok=True)
        exits_fd = fsat.open_dir_at(runtime_fd, exits)
    finally:
        os.close(runtime_fd)
    try:
        fsat.atomic_write_at(exits_fd, os.path.basename(spare), data, mode=0o600)
    finally:
        os.close(exits_fd)


def _off_workdir_fd(fd: int) -> int:
    """`fd`, moved to the lowest free number if it is WORKDIR_FD or HOLD_FD
    (with its close-on-exec flag as it was)."""
    if fd not in (WORKDIR_FD, HOLD_FD):
        return fd
    import fcntl

    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.set_inheritable(moved, os.get_inheritable(fd))
    os.close(fd)
    return moved


def _close_fds_except(keep: set[int]) -> None:
    # Ranges between the kept ones (close_range(2), one call each): the daemon
    # holds ~2 descriptors an agent, and closing 2,000 of them one by one
    # from a listing was on every start's path at 1,000 agents.
    # Never an empty range: CPython passes closerange(0, 0) on as
    # close_range(0, -1), which closed every descriptor (seen: every start
    # failed as "ended before it was ready", tests/root/test_held.py).
    low = 0
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = max(low, fd + 1)
    if _max_fd() > low:
        os.closerange(low, _max_fd())


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 65536
