"""Labels on the files an agent's OWN processes write while its taint is
above Internal (issue 12, "taint survives the workdir").

`write_file`/`edit_file` label what they write (policy/filelabels.py); a
`cp private.txt work/x` in the agent's shell goes round the broker. So while
an agent's ledger holds Private data, the daemon (root) watches the agent's
writable mounts with fanotify and labels every file written there through
the descriptor the event carries, never by path:

- Mount marks, on the mounts of the agent's own mount namespaces (found
  from processes the kernel says are in the agent's scope, each mount opened
  through /proc/<pid>/root and checked by its mount id): only the agent's
  processes write through those mounts, so no pid needs to be trusted or
  matched, and the user's own writes to the same folder outside the sandbox
  raise nothing. A hard link or a rename keeps the inode, so the label.
- Marks are set before a call's reply brings Private data into the agent
  (so no write of it can come before them) and flushed once the taint is
  back at Internal or below (the daemon does no work for a clean agent).
- Events are handled as they come (a bounded batch per loop turn) and all of
  them before the taint may drop: eviction, the budget pushing an entry out
  and a reload first `settle()`, so a write made while tainted is labelled
  at the taint it was made under, however late the daemon reads it. A file
  still open for writing (or mapped shared and writable) at that moment
  gets the label too: its close may come after the drop. If there are too
  many descriptors to look at, the drop is refused.
- The kernel's queue is bounded; when it overflows the events lost are
  unknown, so every later read by this agent's broker is labelled at least
  the taint of that moment (`floor`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator

from leviathd import fanotify
from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import LeviathError
from leviathd.policy import filelabels

WRITES = fanotify.FAN_CLOSE_WRITE | fanotify.FAN_MODIFY
# Opens too: once the agent's processes wrote labelled files, reading one
# back while the taint is lower raises the taint again (`on_read`).
MASK = WRITES | fanotify.FAN_OPEN
# Events handled per turn of the event loop: an agent writing without pause
# costs the daemon this much at a time, then the other agents' turn.
BATCH = 64
TURN_EVENTS = 256
# Past this many events while settling, the agent is writing faster than the
# daemon reads: treated as lost events.
SETTLE_EVENTS = 65536
# Processes and descriptors looked at before a drop of taint; more and the
# drop is refused.
MAX_PIDS = 4096
MAX_DESCRIPTORS = 16384
MAX_MOUNTS = 256
# Mount types holding no files an agent could carry data out of.
_SKIP_FS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "devtmpfs",
                      "bpf", "tracefs", "debugfs", "securityfs", "pstore", "fusectl",
                      "binfmt_misc", "hugetlbfs", "autofs", "configfs", "nsfs"})
CGROUP_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd")


class TooBusy(LeviathError):
    """Too many open descriptors to check before the taint may drop."""


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(field):
        code = field[i + 1:i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mnt_id(fd: int) -> int | None:
    try:
        with open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as f:
            for line in f:
                if line.startswith("mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _fdinfo(pid: int, fd: str) -> tuple[int, int] | None:
    """(flags, mnt_id) of another process's descriptor."""
    flags = mnt = None
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii") as f:
            for line in f:
                if line.startswith("flags:"):
                    flags = int(line.split()[1], 8)
                elif line.startswith("mnt_id:"):
                    mnt = int(line.split()[1])
    except (OSError, ValueError):
        return None
    return (flags, mnt) if flags is not None and mnt is not None else None


def scope_dir(cgroup: str) -> tuple[str, str] | None:
    """The agent's scope, from the caller's cgroup path (the caller may sit
    in a cgroup below it: a container's): its folder under /sys/fs/cgroup
    and its path as /proc/<pid>/cgroup shows it."""
    parts = cgroup.strip("/").split("/")
    for i, part in enumerate(parts):
        if part.startswith("leviath-") and part.endswith(".scope"):
            rel = "/" + "/".join(parts[:i + 1])
            for root in CGROUP_ROOTS:
                if os.path.isfile(f"{root}{rel}/cgroup.procs"):
                    return f"{root}{rel}", rel
            return None
    return None


def _in_scope(pid: int, rel: str) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as f:
            for line in f:
                path = line.rstrip("\n").split(":", 2)[-1]
                if path == rel or path.startswith(rel + "/"):
                    return True
    except OSError:
        pass
    return False


def _scope_pids(scope: str) -> Iterator[int]:
    """Every pid in the scope and the cgroups below it, at most MAX_PIDS
    (TooBusy past that)."""
    seen = 0
    for folder, dirs, _files in os.walk(scope):
        dirs[:] = dirs[:64]
        with contextlib.suppress(OSError), open(f"{folder}/cgroup.procs", encoding="ascii") as f:
            for line in f:
                seen += 1
                if seen > MAX_PIDS:
                    raise TooBusy("too many processes in the agent's scope to check")
                with contextlib.suppress(ValueError):
                    yield int(line)


class WriteWatch:
    def __init__(self, agent_id: str, taint: Callable[[], Sensitivity],
                 on_label: Callable[[Sensitivity], None] | None = None,
                 on_read: Callable[[Sensitivity, str], None] | None = None) -> None:
        self.agent_id = agent_id
        self._taint = taint
        self._on_label = on_label
        self._on_read = on_read
        self._group: int | None = None
        self._mounts: set[int] = set()
        self._namespaces: set[int] = set()  # mount namespaces marked (inode numbers)
        self._reading = False
        # Lost events: every later read is labelled at least this.
        self.floor = Sensitivity.PUBLIC
        # The highest label set on a file (what the shell may read back).
        self.written = Sensitivity.PUBLIC
        self.failed: str | None = None
        # Watched for the agent's whole life: it started in a workdir
        # holding labelled files (opens must be seen whatever the taint).
        self.sticky = False

    @property
    def active(self) -> bool:
        return bool(self._mounts)

    # -- marks ---------------------------------------------------------------

    def ensure(self, pid: int | None, cgroup: str | None, *, rescan: bool = False) -> bool:
        """Mark the writable mounts of the agent's mount namespaces: the first
        time (or with `rescan`), of every one its scope holds (its sandbox, a
        `shell` fence of the moment), then of the calling process's (`pid`,
        which the kernel tied to the agent's scope) if that one is new.
        Processes in the daemon's own mount namespace (the launcher, the
        forwarder) are not the agent's. False when nothing is marked
        (`failed` says why)."""
        try:
            if self._group is None:
                self._group = fanotify.init()
            scope = scope_dir(cgroup) if cgroup else None
            if scope is None:
                self.failed = "the agent's scope was not found"
                return bool(self._mounts)
            folder, rel = scope
            own = os.stat("/proc/self/ns/mnt").st_ino
            candidates = [pid] if pid else []
            if rescan or not self._namespaces:
                candidates += list(_scope_pids(folder))
            for p in candidates:
                try:
                    ns = os.stat(f"/proc/{p}/ns/mnt").st_ino
                except OSError:
                    continue
                # The scope is checked after the namespace: a pid recycled
                # meanwhile is not the scope's.
                if ns == own or ns in self._namespaces or not _in_scope(p, rel):
                    continue
                self._mark_all(p)
                self._namespaces.add(ns)
        except (OSError, TooBusy) as exc:
            self.failed = str(exc)
            return bool(self._mounts)
        if not self._mounts:
            self.failed = "no writable mount of the agent could be marked"
            return False
        self.failed = None
        self._start_reading()
        return True

    def ensure_fence(self, pid: int, cgroup: str) -> bool:
        """The `shell` tool's fence, built and waiting to run its command
        (sandbox/fencehold.py): every writable mount of its namespace is
        marked, even if a scan of the scope met that namespace half built."""
        try:
            ns = os.stat(f"/proc/{pid}/ns/mnt").st_ino
        except OSError as exc:
            self.failed = str(exc)
            return False
        self._namespaces.discard(ns)
        marked = self.ensure(pid, cgroup) and ns in self._namespaces
        if not marked and self.failed is None:
            self.failed = "the shell's fence is not the agent's"
        return marked

    def _mark_all(self, pid: int) -> None:
        assert self._group is not None
        with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.readlines()[:MAX_MOUNTS]
        for line in lines:
            left, _sep, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) < 6 or not tail or tail[0] in _SKIP_FS:
                continue
            if "rw" not in fields[5].split(","):
                continue
            try:
                mount_id = int(fields[0])
            except ValueError:
                continue
            where = _unescape(fields[4])
            try:
                fd = os.open(f"/proc/{pid}/root{where}",
                             os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                # A symlink planted on the way would land on another mount.
                if _mnt_id(fd) != mount_id or not (
                    stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)
                ):
                    continue
                ofd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC
                              | os.O_NONBLOCK | os.O_NOCTTY)
                try:
                    fanotify.mark_mount(self._group, ofd, MASK)
                    self._mounts.add(mount_id)
                except OSError as exc:
                    if exc.errno not in (errno.EINVAL, errno.ENODEV, errno.EXDEV,
                                         errno.EOPNOTSUPP):
                        raise
                finally:
                    os.close(ofd)
            finally:
                os.close(fd)

    def release(self) -> None:
        """The taint is back at Internal or below: events handled, then the
        group closed (marks and all) until the next rise, unless the
        agent's processes wrote labelled files this run: then the marks
        stay, so that their opening one again (which the broker does not
        see) raises the taint through `on_read`. Only such agents hold a
        group: the kernel allows root 128 (fs.fanotify.max_user_groups)."""
        if self._group is None:
            return
        self.drain()
        if (self.written <= Sensitivity.INTERNAL or self._on_read is None) and not self.sticky:
            self.close()

    def close(self) -> None:
        if self._group is None:
            return
        self._stop_reading()
        os.close(self._group)
        self._group = None
        self._mounts.clear()
        self._namespaces.clear()

    # -- events --------------------------------------------------------------

    def _start_reading(self) -> None:
        if self._reading or self._group is None:
            return
        try:
            asyncio.get_running_loop().add_reader(self._group, self._turn)
            self._reading = True
        except RuntimeError:
            pass  # no loop (a unit test): settle() reads them

    def _stop_reading(self) -> None:
        if self._reading and self._group is not None:
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().remove_reader(self._group)
        self._reading = False

    def _turn(self) -> None:
        self.drain(TURN_EVENTS)

    def drain(self, limit: int = SETTLE_EVENTS) -> int:
        """Handle queued events, at most `limit`; returns how many."""
        if self._group is None:
            return 0
        done = 0
        while done < limit:
            events = fanotify.read(self._group, BATCH)
            if not events:
                return done
            for ev in events:
                try:
                    self._handle(ev)
                finally:
                    if ev.fd >= 0:
                        os.close(ev.fd)
            done += len(events)
        return done

    def _handle(self, ev: fanotify.Event) -> None:
        taint = self._taint()
        if ev.mask & fanotify.FAN_Q_OVERFLOW:
            self.lost(taint)
            if self._on_read is not None and self.written > taint:
                # Opens were lost too: one may have been of a labelled file.
                self._on_read(self.written, "(file events lost)")
            return
        if ev.fd < 0:
            return
        if ev.mask & WRITES and taint > Sensitivity.INTERNAL:
            self._label(ev.fd, taint)
        if ev.mask & fanotify.FAN_OPEN and self._on_read is not None and \
                taint < Sensitivity.PRIVATE:
            try:
                kept = filelabels.read_label(ev.fd)
            except OSError:
                kept = None
            if kept is not None and kept > taint:
                try:
                    where = os.readlink(f"/proc/self/fd/{ev.fd}")
                except OSError:
                    where = "?"
                self._on_read(kept, where[:300])

    def _label(self, fd: int, taint: Sensitivity) -> None:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            kept = filelabels.label_written(fd, taint, whole=False)
        except OSError:
            kept = None
        if kept is None:
            # A file system keeping no labels: nothing tells this file apart.
            self.lost(taint)
            return
        if kept > self.written:
            self.written = kept
            if self._on_label is not None:
                self._on_label(kept)

    def lost(self, taint: Sensitivity) -> None:
        if taint > self.floor:
            self.floor = taint
            if self._on_label is not None:
                self._on_label(taint)

    # -- before the taint drops ----------------------------------------------

    def settle(self, cgroup: str | None) -> None:
        """Every write made so far is labelled at today's taint, and so is
        every file the agent's processes still hold open for writing or
        mapped writable on a watched mount. TooBusy when there is too much
        to look at (the caller then keeps the taint)."""
        if self._group is None or not self._mounts:
            return
        taint = self._taint()
        if self.drain() >= SETTLE_EVENTS:
            self.lost(taint)
        scope = scope_dir(cgroup) if cgroup else None
        if scope is None:
            self.lost(taint)
            return
        budget = MAX_DESCRIPTORS
        for pid in _scope_pids(scope[0]):
            budget = self._settle_pid(pid, taint, budget)
        if self.drain() >= SETTLE_EVENTS:
            self.lost(taint)

    def _settle_pid(self, pid: int, taint: Sensitivity, budget: int) -> int:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            return budget
        for name in fds:
            budget -= 1
            if budget < 0:
                raise TooBusy("too many open descriptors in the agent's scope to check")
            info = _fdinfo(pid, name)
            if info is None:
                continue
            flags, mnt = info
            if mnt in self._mounts and flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR):
                self._label_path(f"/proc/{pid}/fd/{name}", taint)
        try:
            with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as f:
                maps = f.readlines()
        except OSError:
            return budget
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) < 6 or fields[1][1] != "w" or fields[1][3] != "s":
                continue
            budget -= 1
            if budget < 0:
                raise TooBusy("too many shared mappings in the agent's scope to check")
            self._label_path(f"/proc/{pid}/map_files/{fields[0]}", taint)
        return budget

    def _label_path(self, magic: str, taint: Sensitivity) -> None:
        """Through /proc's link to the very file the process holds (the
        kernel's, not a name the agent chose)."""
        try:
            fd = os.open(magic, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            return
        try:
            if _mnt_id(fd) in self._mounts:
                self._label(fd, taint)
        finally:
            os.close(fd)
