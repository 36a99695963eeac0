"""The journal: structured records for the daemon's own events (so that
`journalctl LEVIATH_AGENT=<id>` is an audit trail), and stdout streams for an
agent's output opened from inside its scope, so journald files them under the
scope's unit."""

from __future__ import annotations

import socket
import syslog

import pystemd.journal

STDOUT_SOCKET = "/run/systemd/journal/stdout"


def record(message: str, *, priority: int = syslog.LOG_INFO, **fields: object) -> None:
    """Send one structured entry. Field names are upper-cased journal fields;
    None values are left out."""
    extra = {k.upper(): str(v) for k, v in fields.items() if v is not None}
    pystemd.journal.sendv(
        f"PRIORITY={priority}",
        MESSAGE=message,
        SYSLOG_IDENTIFIER="leviathd",
        **extra,
    )


NATIVE_SOCKET = "/run/systemd/journal/socket"


def record_after_fork(message: str, *, priority: int = syslog.LOG_INFO, **fields: object) -> None:
    """`record` for a forked child that closed its parent's descriptors:
    libsystemd caches its journal socket per process, and a child that closed
    it would lose every record. Sends journald's native datagram itself."""
    entries = {"PRIORITY": str(priority), "MESSAGE": message, "SYSLOG_IDENTIFIER": "leviathd"}
    entries.update({k.upper(): str(v) for k, v in fields.items() if v is not None})
    payload = bytearray()
    for key, value in entries.items():
        data = value.encode()
        if b"\n" in data:
            payload += key.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
        else:
            payload += key.encode() + b"=" + data + b"\n"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(bytes(payload), NATIVE_SOCKET)
    except OSError:
        pass


def open_stream(identifier: str, *, priority: int, unit: str = "") -> int:
    """What sd_journal_stream_fd() does: a write-only stream whose lines
    journald records with the identity (and so the unit) of the connecting
    process. Call it after the process sits in the agent's scope.

    `unit` is journald's fallback for a root peer whose cgroup it can no
    longer read: a short-lived agent's supervisor may be gone before journald
    gets to its last lines, which would then lose their _SYSTEMD_UNIT."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(STDOUT_SOCKET)
        sock.shutdown(socket.SHUT_RD)
        # identifier, unit id, priority, level prefix, forward to syslog /
        # kmsg / console.
        header = f"{identifier}\n{unit}\n{priority}\n0\n0\n0\n0\n"
        sock.sendall(header.encode())
    except OSError:
        sock.close()
        raise
    return sock.detach()
