"""An attached agent's output, copied by the daemon itself (issue 18): no
supervisor process per attached agent.

The agent's stdout and stderr are pipes whose read ends the daemon holds
(and the agent's PID 1 keeps a copy of, for a restarted daemon to take back
with pidfd_getfd). Each chunk goes

- to a journald stream the daemon connected, sent with the agent's
  credentials (SCM_CREDENTIALS: PID 1's pid, the user's uid and gid; the
  daemon has CAP_SYS_ADMIN, CAP_SETUID and CAP_SETGID): journald files the
  lines under the agent's scope and into its owner's journal, as if the
  agent had written them. When journald is slow the daemon stops reading
  the pipe, so the agent waits, as it would writing to journald itself:
  the journal's copy is whole;
- to the caller's pipe (`lev run` makes one and copies it to its terminal),
  reopened by the daemon (/proc/self/fd) so that O_NONBLOCK is set on a
  file description of its own: a caller that stops reading costs the agent
  nothing; what does not fit in CLIENT_BACKLOG is dropped, and the caller is
  told how much.

Nothing here waits on a caller or an agent: every descriptor is
non-blocking and every buffer is bounded."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import select
import signal
import socket
import stat
import struct
import syslog

from leviathd import safetext
from leviathd.reaping import reap_when_gone
from leviathd.systemd import journal

log = logging.getLogger(__name__)

# Bytes read from an agent's pipe at a time: also the most the daemon holds
# for the journal per stream while journald catches up.
CHUNK = 65536
# What a caller that does not read may fall behind by, per stream, beyond its
# pipe's own buffer, before its copy has gaps (the journal's never does).
CLIENT_BACKLOG = 65536
# After the agent's end: how long a slow caller gets to take what is held for
# it, and how long the journal's copy may take to drain.
CLIENT_DRAIN_SECONDS = 5.0
DRAIN_SECONDS = 10.0
_SYS_PIDFD_GETFD = 438


def budget() -> int:
    """How many attached agents the daemon copies for at once (6 descriptors
    each): an eighth of its soft file limit in descriptors (the broker
    takes half, the proxy a quarter). Past it, attached agents get a
    supervisor, as before: memory, not the daemon's descriptors."""
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(1, soft // 8 // 6)


def private_pipe(fd: int) -> int | None:
    """The caller's descriptor `fd` opened again, write-only, non-blocking
    and close-on-exec, when it is the write end of an anonymous pipe (never
    a named FIFO, a terminal, a file or a socket: opening those again could
    block or reach what the caller's own descriptor does not); None
    otherwise (the caller then gets a supervisor, as before). The new file
    description is the daemon's alone, so its O_NONBLOCK changes nothing
    for the caller, whose shell may share the original. (A pipe nobody reads
    any more gives a copy whose writes fail, and the caller's copy ends.)"""
    try:
        st = os.fstat(fd)
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        link = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    if (not stat.S_ISFIFO(st.st_mode) or mode not in (os.O_WRONLY, os.O_RDWR)
            or not link.startswith("pipe:[")):
        return None
    try:
        return os.open(f"/proc/self/fd/{fd}",
                       os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no reader left
            return -1
        return None


def take_kept(pid1: int, *, fenced: bool = True) -> tuple[int, int] | None:
    """The read ends of an attached agent's output pipes, from its PID 1
    (namespace/sealed.py OUT_KEEP_FD, ERR_KEEP_FD), for a daemon that restarted; None
    when PID 1 keeps none (a detached agent). Needs CAP_SYS_PTRACE."""
    from leviathd.sandbox.forwarder import _libc
    from leviathd.sandbox.namespace import sealed

    # The pidfd first, and alive after the checks and the taking: then all
    # of them were about one process, not a pid reused in between.
    try:
        pidfd = os.pidfd_open(pid1)
    except OSError:
        return None
    got: list[int] = []
    alive = False
    try:
        # A supervisor (not 1 in a namespace of its own) may hold pipes of
        # its own at these numbers: they are not taken from it.
        with open(f"/proc/{pid1}/status", encoding="utf-8", errors="replace") as f:
            nspid = next((ln.split()[1:] for ln in f.read(1 << 14).splitlines()
                          if ln.startswith("NSpid:")), [])
        if fenced and (len(nspid) < 2 or nspid[-1] != "1"):
            return None
        # Kind none: the recorder is no PID 1, but runs our sealed dash
        # (none.start), which a supervisor never is, and is not dumpable
        # (its /proc files are root's), which a memfd of the user's is.
        if not fenced and (
                not os.readlink(f"/proc/{pid1}/exe").startswith("/memfd:leviath-init")
                or os.stat(f"/proc/{pid1}/fd").st_uid != 0):
            return None
        for number in (sealed.OUT_KEEP_FD, sealed.ERR_KEEP_FD):
            fd = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, number, 0)
            if fd < 0:
                break
            got.append(fd)
            if not stat.S_ISFIFO(os.fstat(fd).st_mode) or (
                    fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE) != os.O_RDONLY:
                break
        # Ended: the status read may have been of another process since.
        alive = not select.select([pidfd], [], [], 0)[0]
    except OSError:
        alive = False
    finally:
        os.close(pidfd)
    if alive and len(got) == 2 and all(
            (fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE) == os.O_RDONLY for fd in got):
        return got[0], got[1]
    for fd in got:
        os.close(fd)
    return None


def scope_witness(pid1: int, unit: str) -> int | None:
    """For a daemon that restarted: a child of ours, moved into the agent's
    scope (PID 1's cgroup) and ended there, whose zombie this daemon keeps
    until the agent's output is copied, as it keeps the held child's on a
    start. Once PID 1 is reaped (by systemd, not us, after a restart), its
    pid speaks for the lines still in the pipes, so they are journaled under
    the agent's scope instead of dropped. None when it could not be placed
    there (PID 1 already gone): then those lines are not journaled, as
    before. A zombie keeps neither memory nor the scope populated."""
    from leviathd.broker.server import cgroup_of
    from leviathd.errors import AccessDenied
    from leviathd.sandbox.container.cgroups import cgroup_procs_files

    try:
        cgroup = cgroup_of(pid1)
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            files = [p for p in cgroup_procs_files(cgroup, f.read()) if os.path.exists(p)]
    except (OSError, AccessDenied):
        return None
    # A pid reused since PID 1's pipes were taken is in another cgroup.
    if unit not in cgroup.split("/") or not files:
        return None
    r, w = os.pipe2(os.O_CLOEXEC)
    # The child inherits a mask blocking every signal it may get (a `lev
    # stop` in between kills it all the same): a handler of the daemon run
    # in it would reach the daemon's event loop through the shared wakeup fd.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            try:
                os.closerange(3, r)
                os.closerange(r + 1, os.sysconf("SC_OPEN_MAX"))
                os.read(r, 1)  # until the daemon has moved it: EOF
            finally:
                os._exit(0)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    os.close(r)
    try:
        for path in files:
            with open(path, "w", encoding="ascii") as f:
                f.write(str(pid))
    except OSError as exc:
        log.warning("no process of ours in %s to speak for its last output: %s", unit, exc)
        os.close(w)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        return None
    os.close(w)
    return pid


class _Stream:
    """One of the agent's pipes, to its journal stream and the caller."""

    def __init__(self, owner: OutputCopy, src: int, priority: int, client: int | None) -> None:
        self._owner = owner
        self.src = src
        self.priority = priority
        self.journal: socket.socket | None = None
        self.pending = b""  # for the journal: at most one CHUNK
        self.client = client if client is not None and client >= 0 else None
        self.backlog = bytearray()
        self.lost = 0
        self.eof = False
        self.reading = False
        os.set_blocking(src, False)

    # -- the agent's side ---------------------------------------------------

    def start(self) -> None:
        self._read_on()

    def _read_on(self) -> None:
        if not self.reading and not self.eof:
            self.reading = True
            self._owner.loop.add_reader(self.src, self.readable)

    def _read_off(self) -> None:
        if self.reading:
            self.reading = False
            self._owner.loop.remove_reader(self.src)

    def readable(self) -> None:
        try:
            data = os.read(self.src, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close_source()
            self._owner.changed()
            return
        self._to_client(data)
        self._to_journal(data)

    # -- the journal's copy ---------------------------------------------------

    def _to_journal(self, data: bytes) -> None:
        if self.journal is None:
            return
        self.pending = data
        self._flush_journal()

    def _flush_journal(self) -> None:
        sock = self.journal
        while self.pending and sock is not None:
            creds = self._owner.credentials()
            if creds is None:
                self._drop_journal()
                return
            try:
                n = sock.sendmsg([self.pending], creds,
                                 socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            except BlockingIOError:
                # journald is behind: the agent waits (its pipe fills), the
                # journal's copy stays whole.
                self._read_off()
                self._owner.loop.add_writer(sock.fileno(), self._journal_writable)
                return
            except ProcessLookupError:
                if self._owner.pid_gone():
                    continue
                self._drop_journal()
                return
            except OSError as exc:
                log.warning("agent %s: its output stopped reaching the journal: %s",
                            self._owner.agent_id, exc)
                self._drop_journal()
                return
            self.pending = self.pending[n:]
        self._read_on()
        self._owner.changed()

    def _journal_writable(self) -> None:
        if self.journal is not None:
            self._owner.loop.remove_writer(self.journal.fileno())
        self._flush_journal()

    def _drop_journal(self) -> None:
        self.pending = b""
        if self.journal is not None:
            with contextlib.suppress(ValueError, OSError):
                self._owner.loop.remove_writer(self.journal.fileno())
            self.journal.close()
            self.journal = None
        self._read_on()
        self._owner.changed()

    # -- the caller's copy ----------------------------------------------------

    def _to_client(self, data: bytes) -> None:
        if self.client is None:
            return
        if not self.backlog:
            try:
                n = os.write(self.client, data)
            except BlockingIOError:
                n = 0
            except OSError:
                self._drop_client()
                return
            data = data[n:]
            if not data:
                return
            self._owner.loop.add_writer(self.client, self._client_writable)
        room = CLIENT_BACKLOG - len(self.backlog)
        if room >= len(data) and not self.lost:
            self.backlog += data
        else:
            self.lost += len(data)

    def _client_writable(self) -> None:
        if self.client is None:
            return
        if not self.backlog and self.lost:
            self.backlog += (f"\n[leviath: {self.lost} bytes of output not shown here (this "
                             "reader fell behind); `lev logs` has all of it]\n").encode()
            self.lost = 0
        try:
            n = os.write(self.client, self.backlog)
        except BlockingIOError:
            return
        except OSError:
            self._drop_client()
            return
        del self.backlog[:n]
        if not self.backlog and not self.lost:
            self._owner.loop.remove_writer(self.client)
            self._owner.changed()

    def _drop_client(self) -> None:
        if self.client is not None:
            self._owner.loop.remove_writer(self.client)
            os.close(self.client)
            self.client = None
        self.backlog.clear()
        self.lost = 0
        self._owner.changed()

    # -- the end ----------------------------------------------------------------

    def drained(self) -> bool:
        return self.eof and not self.pending

    def client_done(self) -> bool:
        return self.client is None or (not self.backlog and not self.lost)

    def close_source(self) -> None:
        self._read_off()
        if self.src >= 0:
            with contextlib.suppress(OSError):
                os.close(self.src)
            self.src = -1
        self.eof = True

    def close(self) -> None:
        self.close_source()
        if self.journal is not None:
            with contextlib.suppress(ValueError, OSError):
                self._owner.loop.remove_writer(self.journal.fileno())
            self.journal.close()
            self.journal = None
        self._drop_client()


class OutputCopy:
    """One attached agent's two pipes (stdout, stderr) to the journal and
    the caller. start() once the agent's PID 1 is known; finish() after its
    end, before the end is announced, so the caller sees all it will see
    first."""

    def __init__(
        self, agent_id: str, unit: str, uid: int, gid: int, sources: tuple[int, int],
        clients: tuple[int | None, int | None] = (None, None), zombie: int | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.unit = unit
        self._uid = uid
        self._gid = gid
        self.loop = asyncio.get_running_loop()
        self._pid = 0
        # PID 1's, to see it reaped before its pid is sent once more: then
        # (by its parent, not us) that pid may be anyone's next process.
        self._pidfd: int | None = None
        # The held child, which left and which the daemon reaps only after
        # this copy: a zombie in the agent's scope, whose pid stays valid for
        # the credentials once PID 1 is gone (and reaped by its new parent).
        self._zombie = zombie
        self._streams = [
            _Stream(self, sources[0], syslog.LOG_INFO, clients[0]),
            _Stream(self, sources[1], syslog.LOG_WARNING, clients[1]),
        ]
        self._drained = self.loop.create_future()
        self._closed = False

    def start(self, pid1: int | None) -> None:
        """Start copying; with `pid1` None (no handover: a supervisor
        journals the output), to the caller only."""
        if pid1 is not None:
            self._pid = pid1
            try:
                self._pidfd = os.pidfd_open(pid1)
            except OSError:
                self._pid_ended()
            for stream in self._streams:
                try:
                    stream.journal = _connect(self.unit, stream.priority)
                except OSError as exc:
                    log.warning("agent %s: no journal stream for its output: %s",
                                self.agent_id, exc)
        for stream in self._streams:
            stream.start()

    def credentials(self) -> list[tuple[int, int, bytes]] | None:
        """Who the next chunk is sent as; None when nobody may speak for the
        agent any more (then the journal's copy ends)."""
        if self._pidfd is not None and not _unreaped(self._pidfd):
            self._pid_ended()
        if not self._pid:
            return None
        return [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS,
                 struct.pack("iII", self._pid, self._uid, self._gid))]

    def _pid_ended(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        if self._pid != self._zombie:
            self._pid = self._zombie or 0

    def pid_gone(self) -> bool:
        """PID 1 is gone and reaped: speak for the agent with the held
        child's zombie, which this daemon keeps in the agent's scope until
        the end. A restarted daemon has none: its copy to the journal then
        ends (never as the daemon itself, whose unit journald would file
        the agent's text under, nor as a pid that may be reused)."""
        had = self._pid
        self._pid_ended()
        return bool(self._pid) and self._pid != had

    def changed(self) -> None:
        if all(s.drained() for s in self._streams) and not self._drained.done():
            self._drained.set_result(None)

    async def finish(self) -> None:
        """After PID 1's end: every writer is gone, so the pipes end once
        read; wait for that (DRAIN_SECONDS at most), then give the caller
        CLIENT_DRAIN_SECONDS for what is held for it, in the background."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._drained), DRAIN_SECONDS)
        for stream in self._streams:
            stream.close_source()
            if stream.journal is not None:
                with contextlib.suppress(ValueError, OSError):
                    self.loop.remove_writer(stream.journal.fileno())
                stream.journal.close()
                stream.journal = None
        self._reap()
        if all(s.client_done() for s in self._streams):
            self.close()
        else:
            self.loop.create_task(self._client_drain())

    async def _client_drain(self) -> None:
        deadline = self.loop.time() + CLIENT_DRAIN_SECONDS
        while self.loop.time() < deadline and not all(s.client_done() for s in self._streams):
            await asyncio.sleep(0.05)
        self.close()

    def close(self) -> None:
        """Let everything go (the daemon's shutdown, or the end)."""
        if self._closed:
            return
        self._closed = True
        for stream in self._streams:
            stream.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self._reap()

    def _reap(self) -> None:
        if self._zombie is not None:
            pid, self._zombie = self._zombie, None
            reap_when_gone(pid)


def _unreaped(pidfd: int) -> bool:
    """The pidfd's process still holds its pid (running, or a zombie whose
    lines journald still files under its scope)."""
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def _connect(unit: str, priority: int) -> socket.socket:
    """A journald stream of the daemon's, its header naming the agent's
    unit: journald trusts that from a root peer, for lines whose sender it
    can no longer place."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(1.0)
        sock.connect(journal.STDOUT_SOCKET)
        sock.shutdown(socket.SHUT_RD)
        sock.sendall(safetext.stream_header(identifier=safetext.AGENT_IDENTIFIER, unit=unit,
                                            priority=priority))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock

