"""The journal: structured records for the daemon's own events (so that
`journalctl LEVIATH_AGENT=<id>` is an audit trail), and stdout streams for an
agent's output opened from inside its scope, so journald files them under the
scope's unit."""

from __future__ import annotations

import logging
import os
import signal
import socket
import syslog

import pystemd.journal

from leviathd import safetext
from leviathd.paths import state_dir

STDOUT_SOCKET = "/run/systemd/journal/stdout"
NATIVE_SOCKET = "/run/systemd/journal/socket"
_log = logging.getLogger("leviathd")


def available() -> bool:
    """journald listens here (where systemd is not PID 1 it usually does not,
    and libsystemd then drops entries silently)."""
    return os.path.exists(NATIVE_SOCKET)


def logs_dir() -> str:
    """Where agents' output goes when there is no journald."""
    return os.path.join(state_dir(), "logs")


def log_path(agent_id: str) -> str:
    return os.path.join(logs_dir(), f"{agent_id}.log")


def _plain(message: str, fields: dict[str, str]) -> str:
    """One line for stderr: the message and the fields that name the agent."""
    keys = ("LEVIATH_EVENT", "LEVIATH_AGENT")
    tags = " ".join(f"{k}={fields[k]}" for k in keys if k in fields)
    return f"{message} [{tags}]" if tags else message


def record(message: str, *, priority: int = syslog.LOG_INFO, **fields: object) -> None:
    """Send one structured entry. Field names are upper-cased journal fields;
    None values are left out. Without journald, a line on stderr (logging)."""
    extra = safetext.journal_fields(message, fields)
    message = extra.pop("MESSAGE")
    if not available():
        level = logging.ERROR if priority <= syslog.LOG_ERR else (
            logging.WARNING if priority <= syslog.LOG_WARNING else logging.INFO)
        _log.log(level, "%s", _plain(message, extra))
        return
    pystemd.journal.sendv(
        f"PRIORITY={int(priority)}",
        MESSAGE=message,
        SYSLOG_IDENTIFIER="leviathd",
        **extra,
    )


def record_after_fork(message: str, *, priority: int = syslog.LOG_INFO, **fields: object) -> None:
    """`record` for a forked child that closed its parent's descriptors:
    libsystemd caches its journal socket per process, and a child that closed
    it would lose every record. Sends journald's native datagram itself."""
    entries = {"PRIORITY": str(int(priority)), "SYSLOG_IDENTIFIER": "leviathd"}
    entries.update(safetext.journal_fields(message, fields))
    message = entries["MESSAGE"]
    payload = bytearray()
    for key, value in entries.items():
        data = value.encode()
        if b"\n" in data:
            payload += key.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
        else:
            payload += key.encode() + b"=" + data + b"\n"
    if not available():
        line = _plain(message, {k: v for k, v in entries.items()}) + "\n"
        try:
            os.write(2, f"leviathd: {line}".encode())
        except OSError:
            pass
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(bytes(payload), NATIVE_SOCKET)
    except OSError:
        pass


def open_log_file(agent_id: str) -> int:
    """The agent's output file where there is no journald: root's, 0600,
    appended to (stdout and stderr share it, in the order written)."""
    os.makedirs(logs_dir(), mode=0o700, exist_ok=True)
    fd = os.open(log_path(agent_id),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return fd


class UserStreams:
    """The agent's output relayed to journald by a process running as the
    agent's user inside its scope (the relay), so that journald files it into
    that user's journal (SplitMode=uid), where plain `journalctl -u UNIT`
    shows it to her, and to nobody else but admins. journald takes _UID, _PID
    and the unit from whoever writes each chunk, not from who connected, so
    the relay must do the writing; the supervisor writes into its pipes.

    The relay holds nothing but those pipes and its streams, and is not
    dumpable (it changed its ids), so its user cannot reach the supervisor
    through it; she can kill it, which only costs her her own agent's log."""

    def __init__(self, fds: list[int], pid: int) -> None:
        self.fds = fds
        self._pid = pid

    @classmethod
    def open(cls, uid: int, gid: int, streams: list[tuple[str, int]], unit: str) -> UserStreams:
        """`streams`: (identifier, priority) each; the write ends come back in
        that order."""
        headers = [safetext.stream_header(identifier=i, unit=unit, priority=p)
                   for i, p in streams]
        pipes = [os.pipe2(os.O_CLOEXEC) for _ in headers]
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the relay
            code = 1
            try:
                code = _relay(uid, gid, headers, [r for r, _w in pipes], ready_w)
            finally:
                os._exit(code)
        os.close(ready_w)
        for r, _w in pipes:
            os.close(r)
        answer = os.read(ready_r, 1)
        os.close(ready_r)
        writers = [w for _r, w in pipes]
        if answer != b"1":
            for fd in writers:
                os.close(fd)
            os.waitpid(pid, 0)
            raise OSError("could not connect the agent's journal streams as its user")
        return cls(writers, pid)

    def close(self) -> None:
        """After the last write: the relay sends what is left and ends."""
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.waitpid(self._pid, 0)
        except ChildProcessError:
            pass


def _relay(uid: int, gid: int, headers: list[bytes], readers: list[int], ready: int) -> int:
    import fcntl
    import select
    import termios
    import time

    low = 0
    for fd in sorted({ready, *readers}):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)
    # `lev stop` signals every process of the scope: the agent's last words
    # still get through; the relay ends when the supervisor closes its pipes.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    routes: dict[int, int] = {}
    try:
        for header, reader in zip(headers, readers, strict=True):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(STDOUT_SOCKET)
            sock.shutdown(socket.SHUT_RD)
            sock.sendall(header)
            routes[reader] = sock.detach()
    except OSError:
        return 1
    os.write(ready, b"1")
    os.close(ready)
    while routes:
        for fd in select.select(list(routes), [], [])[0]:
            data = os.read(fd, 65536)
            if not data:
                os.close(fd)
                out = routes.pop(fd)
                # journald reads the writer's cgroup when it gets to the data:
                # stay in the scope until it has taken all of it.
                deadline = time.monotonic() + 2
                buf = bytearray(4)
                while time.monotonic() < deadline:
                    fcntl.ioctl(out, termios.TIOCOUTQ, buf)
                    if int.from_bytes(buf, "little") == 0:
                        break
                    time.sleep(0.01)
                continue
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(routes[fd], view):]
            except OSError:
                pass
    return 0


def open_stream(identifier: str, *, priority: int, unit: str = "", agent_id: str = "") -> int:
    """What sd_journal_stream_fd() does: a write-only stream whose lines
    journald records with the identity (and so the unit) of the connecting
    process. Call it after the process sits in the agent's scope.

    `unit` is journald's fallback for a root peer whose cgroup it can no
    longer read: a short-lived agent's supervisor may be gone before journald
    gets to its last lines, which would then lose their _SYSTEMD_UNIT.

    Without journald (no stdout socket) and with `agent_id`: the agent's log
    file (open_log_file) instead."""
    if agent_id and not os.path.exists(STDOUT_SOCKET):
        return open_log_file(agent_id)
    header = safetext.stream_header(identifier=identifier, unit=unit, priority=priority)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(STDOUT_SOCKET)
        sock.shutdown(socket.SHUT_RD)
        sock.sendall(header)
    except OSError:
        sock.close()
        raise
    return sock.detach()
