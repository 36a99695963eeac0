"""Answers come from outside the agents (issue 43): a control call (an
approval's answer, a stop, a policy or configuration edit) is refused when
the process that made the bus connection sits in any agent's scope
(`leviath.slice`, a `leviath-*.scope`), whatever its uid. An agent's own
processes, or anything that runs in its scope for it (a container engine, a
build's RUN step), reach the system bus as the agent's user: without this,
the agent could approve its own held calls.

Where the caller runs comes from the kernel: the bus names the connection's
process (its pid, and on buses that give one, a pidfd: dbus-broker, recent
dbus-daemon); the cgroup is read from /proc and then checked to belong to that
very process, alive (the pidfd still names it), so a recycled pid cannot
stand in for it. Without a pidfd from the bus one is opened on the pid;
a caller whose process is gone, or that the bus cannot name, is refused."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal

from dbus_fast import Message, MessageType
from dbus_fast.aio import MessageBus

from leviathd.errors import AccessDenied

_MAX_CGROUP = 64 * 1024
_SCOPE = re.compile(r"^leviath-.+\.scope\Z")
SLICE = "leviath.slice"


def agent_part(cgroup_file: str) -> str | None:
    """The agent slice or scope a /proc/<pid>/cgroup text puts the process
    in (in any hierarchy), else None."""
    for line in cgroup_file.splitlines():
        path = line.split(":", 2)[-1]
        for part in path.split("/"):
            if part == SLICE or _SCOPE.match(part):
                return part
    return None


def _where(pid: int, pidfd: int) -> str | None:
    """The agent part of `pid`'s cgroup, read while `pidfd` (that process)
    is alive. Blocking (it reads /proc): run off the event loop."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            text = f.read(_MAX_CGROUP)
        # What was read is the process the pidfd names only if it still
        # lives now: its pid was not recycled meanwhile.
        signal.pidfd_send_signal(pidfd, 0)
    except OSError:
        raise AccessDenied(f"the calling process (pid {pid}) is gone: cannot tell that it "
                           "runs outside every agent") from None
    return agent_part(text)


def _opened(pid: int) -> int:
    try:
        return os.pidfd_open(pid)
    except OSError:
        raise AccessDenied(f"the calling process (pid {pid}) is gone: cannot tell that it "
                           "runs outside every agent") from None


async def _credentials(bus: MessageBus, sender: str) -> tuple[int, int]:
    """(pid, pidfd) of the process behind `sender`, the pidfd the bus's own
    when it gives one, else opened here on the pid."""
    reply = await bus.call(Message(
        destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
        interface="org.freedesktop.DBus", member="GetConnectionCredentials",
        signature="s", body=[sender],
    ))
    if reply is None or reply.message_type is MessageType.ERROR:
        raise AccessDenied("the bus could not say which process is calling")
    fds = list(reply.unix_fds or [])
    try:
        creds = reply.body[0]
        if "ProcessID" not in creds:
            raise AccessDenied("the bus could not say which process is calling")
        pid = int(creds["ProcessID"].value)
        held = creds.get("ProcessFD")
        index = held.value if held is not None else None
        if isinstance(index, int) and 0 <= index < len(fds):
            return pid, fds.pop(index)
        return pid, _opened(pid)
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


async def require_outside(bus: MessageBus, sender: str, what: str) -> None:
    """Raise AccessDenied naming `what` unless the caller's process runs
    outside every agent's scope."""
    pid, pidfd = await _credentials(bus, sender)
    try:
        part = await asyncio.to_thread(_where, pid, pidfd)
    finally:
        os.close(pidfd)
    if part is not None:
        raise AccessDenied(
            f"refused to {what} from inside an agent (pid {pid} runs in {part}): answers and "
            "control calls come from outside every agent")
