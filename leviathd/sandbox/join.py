"""Run one command inside an agent's running fence: the `shell` tool and
blueprint tools (gate/shell.py), so that they see what the agent's own
processes see, the same files at the same paths: its home, its /tmp, its
throwaway layer, its workdir (issue 33). A fresh fence built from the
recorded spec had a scratch of its own, empty, and under `--workdir-mode
throwaway` read the host's tree instead of the agent's layer.

The fence is found from facts, never from what the agent says: PID 1 of
the step running now is the agent's anchor process the daemon recorded (the
supervisor, or PID 1 itself once handed over) or one of its children, is
PID 1 of a PID namespace of its own (NSpid), sits in the agent's scope, and
is still the process its pidfd names when we enter it. The agent can do
nothing to PID 1's namespaces: it holds no capability in them.

This process enters PID 1's mount, PID, IPC, UTS and network namespaces
(setns on the pidfd) and forks the command, which does what the agent's own
PID 2 does (sandbox/namespace/pid1.py `exec_agent`: the user's ids, every capability
dropped, no_new_privs, the seccomp filter, the workdir) but stays in this
process's session and group, so the daemon's kill of the group on a time-out
reaches it. After the setns this process's root is the agent's: nothing is
imported from there (sys.path is emptied first, so a module the agent
planted in a folder it can write is never root's code).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable

from leviathd.domain.sandbox import SandboxKind
from leviathd.errors import Unavailable
from leviathd.sandbox.namespace import pid1, syscalls
from leviathd.sandbox.spec import SandboxSpec

_FLAGS = (syscalls.CLONE_NEWNS | syscalls.CLONE_NEWPID | syscalls.CLONE_NEWIPC
          | syscalls.CLONE_NEWUTS | syscalls.CLONE_NEWNET)  # fmt: skip
_MAX_STATUS = 64 * 1024


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read(_MAX_STATUS)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        with contextlib.suppress(OSError, ValueError):
            found += [int(c) for c in _read(f"/proc/{pid}/task/{tid}/children").split()]
    return found


def _status(pid: int) -> dict[str, str]:
    fields = {}
    for line in _read(f"/proc/{pid}/status").splitlines():
        key, _sep, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def _in_unit(pid: int, unit: str) -> bool:
    return any(unit in line.split(":", 2)[-1].split("/")
               for line in _read(f"/proc/{pid}/cgroup").splitlines())  # fmt: skip


def find_pid1(anchor: int, unit: str) -> int:
    """A pidfd on PID 1 of the agent's running fence (see the module's
    docstring for the facts it must meet); Unavailable when there is none
    (between two steps, or the agent is ending)."""
    own_mnt = os.stat("/proc/self/ns/mnt").st_ino
    for pid in [anchor, *_children(anchor)]:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            st = _status(pid)
            nspid = st.get("NSpid", "").split()
            parent_ok = pid == anchor or st.get("PPid") == str(anchor)
            if (len(nspid) >= 2 and nspid[-1] == "1" and parent_ok and _in_unit(pid, unit)
                    and os.stat(f"/proc/{pid}/ns/mnt").st_ino != own_mnt):
                # What was read is of the process the pidfd names only
                # if it still lives now (its pid was not reused meanwhile).
                signal.pidfd_send_signal(pidfd, 0)
                return pidfd
        except OSError:
            pass
        os.close(pidfd)
    raise Unavailable("the agent runs no fence now (between two steps, or ending)")


def run(
    spec: SandboxSpec, *, anchor: int, unit: str, ready: Callable[[], None] | None = None
) -> int:
    """Run spec.argv in the agent's running fence; its exit status."""
    if spec.kind != SandboxKind.NAMESPACE:
        raise Unavailable(f"cannot join a {str(spec.kind)!r} sandbox")
    pidfd = find_pid1(anchor, unit)
    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    # No import may come from the agent's root, which is ours after setns.
    sys.path[:] = []
    sys.path_importer_cache.clear()
    try:
        syscalls.setns(pidfd, _FLAGS)
    except syscalls.FenceError as exc:
        raise Unavailable(f"cannot enter the agent's fence: {exc}") from exc
    finally:
        os.close(pidfd)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        try:
            if ready is not None:
                ready()
        except BaseException as exc:
            pid1.fail(wfd, f"leviathd shell: {exc}")
        pid1.exec_agent(spec, wfd, new_session=False)  # never returns
    os.close(wfd)
    said = pid1.read_all(rfd)
    os.close(rfd)
    if said:
        os.write(2, said)
    _pid, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)
