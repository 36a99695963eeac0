"""Sealed copies of the host's catatonit and dash: root's memfds, mode
0711, so the agent's user may exec them but not read them, and the kernel
makes the process that runs one non-dumpable (PID 1 of a fence, the
recorder beside a kind-none agent). Made once in the daemon and inherited
by every fork (shared_sealed); the descriptor numbers the recorder keeps."""

from __future__ import annotations

import fcntl
import os
import stat

INIT_CANDIDATES = ("/usr/bin/catatonit", "/usr/libexec/podman/catatonit")
_MAX_INIT_BYTES = 16 << 20
_MFD_EXEC = 0x10  # kernels with vm.memfd_noexec want it said; older ones refuse it


# PID 1 of a start()ed agent: dash runs the command as its one job (it reaps
# every other child while it waits, as an init must), keeps the exit record
# from it, and writes the status there: 128+N when a signal N ended it. A
# signal from outside does not reach it (PID 1 without a handler), so `lev
# stop` still leaves the record; ~120 KB where a Python supervisor held MBs.
# `exec` in a subshell runs the command from PATH as execvp would, never a
# dash builtin of that name (`echo -e` stays coreutils'). PATH is reset
# before printf: a PATH with dash's `%builtin` in it would look for printf
# in the user's folders first, and run her program with the record open.
SHELL_CANDIDATES = ("/usr/bin/dash", "/bin/dash")
EXIT_FD = 9
# network = "proxy": the listening socket of 127.0.0.1:3128 in the agent's
# network namespace, which PID 1 keeps for the daemon (forwarder.take_listener).
LISTEN_FD = 8
# An attached agent whose output the daemon copies: PID 1 keeps the read
# ends of its stdout and stderr pipes, so the pipes outlive a daemon restart
# and the new daemon takes them again (agents/output.py).
OUT_KEEP_FD = 7
ERR_KEEP_FD = 6
RECORDER_SCRIPT = (f'(exec "$@") {EXIT_FD}>&- {LISTEN_FD}>&- {OUT_KEEP_FD}>&- {ERR_KEEP_FD}>&-; '
                   f's=$?; PATH=/; '
                   f'printf \'{{"exit_status": %d}}\\n\' "$s" >&{EXIT_FD}')


def sealed_shell() -> int | None:
    """A sealed copy of dash, as sealed_init makes of catatonit: PID 1
    holds the exit record's descriptor, which the agent (same uid) must not
    reach through /proc/1/fd or ptrace."""
    return sealed_init(SHELL_CANDIDATES)


_shared: dict[tuple[str, ...], tuple[tuple[int, int, int, int], int]] = {}
# The daemon's sealed catatonit (shared_sealed(INIT_CANDIDATES)), inherited
# by a supervisor's worker: PID 1 runs it rather than make a copy of its own
# (700 KB of memory per agent and a read of the file per start).
shared_init: int | None = None


def shared_sealed(candidates: tuple[str, ...]) -> int | None:
    """In the daemon: one sealed copy for every agent (forks inherit the
    descriptor), not one each: its pages are then shared between all the
    PID 1s that run it (less PSS), and it is held once, not per agent
    (dash 125 KB, catatonit 700 KB). Sealed, nobody can change it; made
    again when the host's file changes (an upgrade)."""
    for path in candidates:
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        held = _shared.get(candidates)
        if held is not None and held[0] == key:
            return held[1]
        fd = sealed_init((path,))
        if fd is None:
            return None
        if held is not None:
            os.close(held[1])  # forks made before keep their own copy of it
        _shared[candidates] = (key, fd)
        return fd
    return None


def sealed_init(candidates: tuple[str, ...] = INIT_CANDIDATES) -> int | None:
    """A sealed copy of the host's catatonit in a memfd, root's, mode 0711.
    The agent's user may exec it but not read it, so the kernel makes the
    process non-dumpable at exec: the agent (same uid) cannot ptrace or
    freeze its PID 1, nor open /proc/1/exe or /proc/1/mem. (Run from the
    host's file, which anyone may read, PID 1 would be dumpable.)"""
    for path in candidates:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
                continue  # not a system file: not run as anyone's PID 1
            data = os.read(fd, _MAX_INIT_BYTES)
        finally:
            os.close(fd)
        flags = os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING
        try:
            mfd = os.memfd_create("leviath-init", flags | _MFD_EXEC)
        except OSError:
            mfd = os.memfd_create("leviath-init", flags)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(mfd, view) :]
            os.fchmod(mfd, 0o711)
            fcntl.fcntl(mfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK
                        | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)  # fmt: skip
        except OSError:
            os.close(mfd)
            return None
        return mfd
    return None
