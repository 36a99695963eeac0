"""The journal: structured records for the daemon's own events (so that
`journalctl LEVIATH_AGENT=<id>` is an audit trail), and stdout streams for an
agent's output opened from inside its scope, so journald files them under the
scope's unit."""

from __future__ import annotations

import logging
import os
import socket
import syslog

import pystemd.journal

from leviathd import safetext

STDOUT_SOCKET = "/run/systemd/journal/stdout"
NATIVE_SOCKET = "/run/systemd/journal/socket"
_log = logging.getLogger("leviathd")


def available() -> bool:
    """journald listens here (where systemd is not PID 1 it usually does not,
    and libsystemd then drops entries silently)."""
    return os.path.exists(NATIVE_SOCKET)


def logs_dir() -> str:
    """Where agents' output goes when there is no journald."""
    return os.path.join(os.environ.get("LEVIATH_STATE_DIR", "/var/lib/leviath"), "logs")


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
