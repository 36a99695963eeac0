"""Descriptors that arrive with a message are the daemon's to close.

dbus-fast keeps every descriptor a message carries in `msg.unix_fds` and
closes none: those no argument names (a client may attach 16 to any call,
signal or unknown method) would stay open in the daemon for good, so any
local user could use up its file limit, polkit's refusal notwithstanding.
Only RunAttached takes descriptors (stdin, stdout, stderr, each closed once
by its handler); everything else is closed here, as the message arrives,
and its slot set to -1 so that nothing handed on names a number the daemon
may since have reused."""

from __future__ import annotations

import fcntl
from typing import Any

from dbus_fast import Message, MessageType

from leviathd import fdclose
from leviathd.bus.names import MANAGER_IFACE, OBJECT_PATH

_TAKES_FDS = ("RunAttached", "a{sv}hhh", 3)


def owned_only(msg: Message) -> None:
    """A message handler (MessageBus.add_message_handler): close what no
    handler will take; give each named argument a descriptor of its own (the
    same one named three times would otherwise be closed three times, the
    second time perhaps another thread's new file)."""
    # dbus-fast gives a message that carried no descriptor its reader's own
    # list, which the next message's descriptors are then added to (its
    # reset only replaces a list that is not empty). A reply awaited by a
    # coroutine (bus/outside.py) was read, then so were other clients' calls
    # before the coroutine ran: it found their descriptors (another `lev
    # run`'s stdin and pipes) as its own and closed them, and their handlers
    # later closed the same numbers again, by then other files of the
    # daemon's. Here, as it arrives, while the list holds only what this
    # message carried, each message gets a list of its own.
    fds: Any = list(msg.unix_fds or ())
    msg.unix_fds = fds
    if not fds or msg.message_type not in (MessageType.METHOD_CALL, MessageType.SIGNAL):
        # A reply comes from whom the daemon called (the bus daemon lets no
        # one else send one): its caller takes what it carries.
        return
    named: list[int] = []
    member, signature, count = _TAKES_FDS
    if (msg.message_type is MessageType.METHOD_CALL and msg.interface == MANAGER_IFACE
            and msg.path == OBJECT_PATH and msg.member == member
            and msg.signature == signature and isinstance(msg.body, list)):
        idx = msg.body[1:1 + count]
        if all(type(i) is int and 0 <= i < len(fds) for i in idx):
            named = list(idx)
    keep: set[int] = set()
    for pos, i in enumerate(named, start=1):
        if i in keep:
            try:
                fds.append(fcntl.fcntl(fds[i], fcntl.F_DUPFD_CLOEXEC, 3))
            except OSError:
                fds.append(-1)
            i = len(fds) - 1
            msg.body[pos] = i
        keep.add(i)
    for n, fd in enumerate(fds):
        if n not in keep and fd >= 0:
            # Off the loop: a FUSE file's close waits on its server (fdclose.py).
            fdclose.discard(fd)
            fds[n] = -1
