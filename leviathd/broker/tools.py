"""The tools themselves. File tools open through the agent's opener (as the
agent's user) and decide on the real path of the opened descriptor; the web
tools are in net.py; `shell` is the daemon's (it runs in the agent's own
sandbox), handed in as a callable.
"""

from __future__ import annotations

import json
import os
import posixpath
import stat
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from leviathd.broker import net
from leviathd.broker.limits import too_large
from leviathd.broker.opener import Opener, OpenFailed
from leviathd.domain.brokerlimits import Limits
from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import AccessDenied, InvalidArgument, LimitExceeded
from leviathd.policy import filelabels
from leviathd.policy.readgrant import GrantIndex
from leviathd.readpatterns import is_inside

MAX_READ = 1 << 20
READ_FLAGS = os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK  # NONBLOCK: a FIFO cannot hang us
# Room left in a reply, per path still to come, for a short error entry.
_ENTRY_RESERVE = 400
_SHOWN = 200
# A read_file read with the open that finds its real path (read_ahead) keeps
# at most this much content across the decision: more is read again after it.
AHEAD_MAX = 64 << 10
_TAIL = len(b', "truncated": false}')
# Folders above a written file that keep its mark, at most.
_MAX_MARK_DEPTH = 256


class RealPathRefused(AccessDenied):
    """The path leads outside what the agent may read or write (through a
    symlink, `..` or a race). Its message is the same whatever exists there."""


@dataclass(frozen=True)
class ShellRequest:
    agent_id: str
    command: str
    timeout: int | None


# The daemon's shell runner: runs `command` inside the agent's own sandbox
# and returns {"exit_status": int, "stdout": str, "stderr": str}.
ShellRunner = Callable[[ShellRequest], Awaitable[Mapping[str, Any]]]


@dataclass(frozen=True)
class ArgvRequest:
    """A blueprint tool's command (policy/tooldef.py rendered it), for the
    daemon to run as the shell's are: in the agent's own scope and fence."""

    agent_id: str
    argv: tuple[str, ...]
    timeout: int


ArgvRunner = Callable[[ArgvRequest], Awaitable[Mapping[str, Any]]]


class RawJSON:
    """A reply's result already encoded as JSON, in parts: file content is
    encoded once, by the worker in the agent's scope, and relayed as is."""

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts
        self.size = sum(len(p) for p in parts)

    @classmethod
    def of(cls, value: Any) -> RawJSON:
        return cls([json.dumps(value, ensure_ascii=False).encode()])


def fd_real_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def reader(view: Opener, outside: Opener | None, workdir: str, path: str) -> Opener:
    """Writes, and reads in the workdir, go through `view`, the agent's own
    view (its fence's mounts: its read-only binds, its throwaway layer, its
    masks). A granted read path outside the workdir is the broker's own
    channel beyond the fence (docs/security-model.md, "Reads outside the
    workdir": the agent's home in its fence is an empty scratch): it goes
    through `outside`, the user's view of the host, and is decided on by
    the grants, which never take a hidden path."""
    if outside is None or is_inside(posixpath.normpath(path), workdir):
        return view
    return outside


def refuse_several_names(st: os.stat_result, path: str) -> None:
    """Grants and rules judge a file by one of its names; a hard link gives
    it another (`ln keys/server.pem notes.txt`, made before the call or
    during it). Decided on the opened descriptor's link count, a fact of
    the file whatever name it was opened by (issue 48 §4)."""
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        raise RealPathRefused(f"{shown(path)}: has several names (hard links), and rules and "
                              "grants judge one name; refused")


def shown(path: str) -> str:
    """An agent-given path, bounded for echoing back in a message."""
    return path if len(path) <= _SHOWN else path[:_SHOWN] + "…"


def _enc(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


class FileTools:
    """read_file, read_files, list_dir, write_file, edit_file for one agent.
    Blocking; the broker runs these in a worker thread. Decisions are taken
    here, on the real paths of the descriptors the worker opened; the reading,
    encoding and editing are the worker's, in the agent's scope."""

    def __init__(self, opener: Opener, index: GrantIndex, limits: Limits | None = None) -> None:
        self.opener = opener
        self.index = index
        self.limits = limits or Limits()
        # What this call touched, for the broker's labels: (real path, inode
        # key, label kept with the file) of every file or directory read;
        # (inode key, label now kept or None) of files written.
        self.reads: list[tuple[str, tuple[int, int], Sensitivity | None]] = []
        self.writes: list[tuple[tuple[int, int], Sensitivity | None]] = []
        # The agent's taint when the call started: what a write carries.
        self.taint = Sensitivity.PUBLIC
        # The real paths the gate decided on (resolve.py): a descriptor with
        # another real path (a link swapped since) is refused. None: any.
        self.decided: frozenset[str] | None = None
        # Where granted read paths outside the workdir are opened (the host's
        # view, as the user), when `opener` is the agent's own view: see
        # `reader`. None: `opener` for everything.
        self.outside: Opener | None = None

    def reader(self, path: str) -> Opener:
        """The opener a read of `path` goes through (resolve.reader)."""
        return reader(self.opener, self.outside, self.index.workdir, path)

    def _check_decided(self, path: str, real: str) -> None:
        if self.decided is not None and real not in self.decided:
            raise RealPathRefused(f"{shown(path)}: leads elsewhere than when the call was "
                                  "decided (changed meanwhile); refused")

    def _refused(self, path: str, verb: str) -> RealPathRefused:
        # One message whatever is (or is not) behind the path: the agent must
        # not learn what exists under hidden folders or where a link leads.
        where = "its workdir and granted read paths" if verb == "read" else "its workdir"
        return RealPathRefused(
            f"{shown(path)}: not granted: outside what this agent may {verb} ({where})"
        )

    def _failed(self, exc: OpenFailed, path: str, verb: str) -> Exception:
        """The open's error if it happened where the agent may look, else the refusal."""
        if exc.where is None or not self.index.may_read(exc.where):
            return self._refused(path, verb)
        return OSError(exc.errno, exc.strerror, shown(path))

    def _open_read(
        self, path: str, *, directory: bool = False, ahead: tuple[int, int] | None = None
    ) -> tuple[int, str, tuple[bytes, bool] | None]:
        """The descriptor, its real path, and with `ahead` (max_bytes, budget)
        the content the worker read with the open, if any."""
        flags = READ_FLAGS | (os.O_DIRECTORY if directory else 0)
        content = None
        opener = self.reader(path)
        try:
            if ahead is None:
                fd = opener.open(path, flags)
            else:
                fd, content = opener.open_read(path, flags, *ahead)
        except OpenFailed as exc:
            raise self._failed(exc, path, "read") from None
        try:
            real = fd_real_path(fd)
            if not self.index.may_read(real):
                raise self._refused(path, "read")
            self._check_decided(path, real)
            st = os.fstat(fd)
            if not directory and not stat.S_ISREG(st.st_mode):
                raise InvalidArgument(f"{shown(path)}: not a regular file")
            if not directory:
                refuse_several_names(st, path)
            kept = filelabels.read_label(fd)
        except BaseException:
            os.close(fd)
            raise
        self.reads.append((real, (st.st_dev, st.st_ino), kept))
        return fd, real, content

    def _read_entry(self, path: str, max_bytes: int, budget: int) -> list[bytes]:
        """One file as `{"path", "content", "truncated"}` in at most `budget` bytes."""
        tail = len(b', "truncated": false}')
        # Guess the room the real path leaves; read again if the guess was short.
        guess = budget - len(_enc({"path": path})) - len(b', "content": ') - tail - 16
        fd, real, got = self._open_read(path, ahead=(max_bytes, guess) if guess >= 2 else None)
        try:
            head = _enc({"path": real})[:-1] + b', "content": '
            room = budget - len(head) - tail
            if got is not None and len(got[0]) > room:
                got = None
            if got is None:
                got = self.opener.read(fd, max_bytes, room) if room >= 2 else None
        finally:
            os.close(fd)
        if got is None:
            limit = self.limits.reply_max_bytes
            raise too_large("reply_max_bytes", limit, "no room left in the reply for this file")
        content, truncated = got
        return [head, content, b', "truncated": true}' if truncated else b', "truncated": false}']

    def read_ahead(self, path: str, max_bytes: int | None, budget: int
                   ) -> tuple[str, RawJSON | None]:
        """What the gate decides a read_file of `path` on (its real path, as
        resolve.real_read_path gives it) and, for a small regular file, the
        reply `read_file` would give, from one open through the worker
        instead of two (issue 47). Blocking. The reply is the broker's to
        hand over only once the gate allowed this real path; nothing is
        opened where the agent may not read as written, and a real path it
        may not read is given back lexical, as resolve does (the run then
        refuses it), with no content."""
        plan = self.plan_ahead(path, max_bytes, budget)
        if plan is None:
            return path, None
        try:
            fd, got = self.reader(path).open_read(path, READ_FLAGS, plan[2], plan[3])
        except OpenFailed:
            return path, None
        return self.take_ahead(path, fd, got, plan, budget)

    def plan_ahead(self, path: str, max_bytes: int | None, budget: int
                   ) -> tuple[int, int, int, int] | None:
        """For read_ahead: (the bytes the call may read, the room for their
        encoding, and both as the worker reads them with the open, at most
        AHEAD_MAX); None: `path` is not one the agent may read as written,
        and nothing is opened for it."""
        if not self.index.may_read(path):
            return None
        limit = self._max(max_bytes)
        guess = budget - len(_enc({"path": path})) - len(b', "content": ') - _TAIL - 16
        return limit, guess, min(limit, AHEAD_MAX), min(guess, AHEAD_MAX)

    def take_ahead(self, path: str, fd: int, got: tuple[bytes, bool] | None,
                   plan: tuple[int, int, int, int], budget: int
                   ) -> tuple[str, RawJSON | None]:
        """read_ahead's checks on the descriptor the worker opened for `path`
        and the content it read with it (`got`): the real path to decide on,
        and the reply if this descriptor may be read. Blocking on a file
        system whose server may wait (localfs.py says where it does not).
        The descriptor is closed here: none is held while the gate decides."""
        guess = plan[1]
        try:
            real = fd_real_path(fd)
            if not self.index.may_read(real):
                return path, None
            st = os.fstat(fd)
            # A file of several names is left to the run, which refuses it
            # (refuse_several_names): the read ahead must never hand it over.
            if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1 or got is None or guess < 2:
                return real, None
            content, truncated = got
            if truncated and plan[2:] != plan[:2]:
                return real, None  # cut by AHEAD_MAX, not by what was asked
            head = _enc({"path": real})[:-1] + b', "content": '
            if len(content) > budget - len(head) - _TAIL:
                return real, None
            label = filelabels.read_label(fd)
        finally:
            os.close(fd)
        self.reads.append((real, (st.st_dev, st.st_ino), label))
        return real, RawJSON([head, content, b', "truncated": true}' if truncated
                              else b', "truncated": false}'])

    def _max(self, max_bytes: int | None) -> int:
        limit = self.limits.read_max_bytes
        return min(max_bytes, limit) if max_bytes and max_bytes > 0 else limit

    def read_file(self, path: str, max_bytes: int | None, budget: int) -> RawJSON:
        return RawJSON(self._read_entry(path, self._max(max_bytes), budget))

    def read_files(self, paths: Sequence[str], max_bytes: int | None, budget: int) -> RawJSON:
        limit = self.limits.read_max_paths
        if len(paths) > limit:
            raise too_large("read_max_paths", limit, f"{len(paths)} paths in one read_files")
        parts = [b'{"files": [']
        used = len(parts[0]) + 2
        for i, path in enumerate(paths):
            room = budget - used - _ENTRY_RESERVE * (len(paths) - i - 1) - 2
            try:
                entry = self._read_entry(path, self._max(max_bytes), room)
            except (OSError, LimitExceeded, InvalidArgument) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                entry = [_enc({"path": shown(path), "error": why})]
            if i:
                entry.insert(0, b", ")
            parts += entry
            used += sum(len(p) for p in entry)
        parts.append(b"]}")
        return RawJSON(parts)

    def list_dir(self, path: str, budget: int) -> RawJSON:
        fd, real, _ = self._open_read(path, directory=True)
        try:
            head = _enc({"path": real})[:-1] + b', "entries": '
            room = budget - len(head) - len(b', "truncated": false}')
            if room < 2:
                limit = self.limits.reply_max_bytes
                raise too_large("reply_max_bytes", limit, "no room in the reply for the listing")
            entries, truncated = self.opener.list(fd, room)
        finally:
            os.close(fd)
        return RawJSON([head, entries,
                        b', "truncated": true}' if truncated else b', "truncated": false}'])

    def _open_write(self, path: str, flags: int) -> tuple[int, str]:
        """Open the parent directory, check its real path is inside the
        workdir, then open the last component relative to that descriptor
        with O_NOFOLLOW: neither a symlinked parent nor a symlinked file can
        take a write outside, and nothing is truncated before the checks."""
        parent, name = os.path.split(path)
        if name in ("", ".", ".."):
            raise InvalidArgument(f"{shown(path)}: not a file name")
        try:
            dfd = self.opener.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY)
        except OpenFailed as exc:
            raise self._failed(exc, path, "write") from None
        try:
            real_dir = fd_real_path(dfd)
            if not self.index.may_write(real_dir):
                raise self._refused(path, "write")
            fd = self.opener.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=dfd)
        except OpenFailed as exc:
            # Below a folder the agent may write: the error is its own to see.
            raise OSError(exc.errno, exc.strerror, shown(path)) from None
        finally:
            os.close(dfd)
        try:
            real = fd_real_path(fd)
            st = os.fstat(fd)
            if not self.index.may_write(real):
                raise self._refused(path, "write")
            self._check_decided(path, real)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidArgument(f"{shown(path)}: not a regular file")
            if st.st_nlink > 1:
                # Another name for the same file may live outside the workdir.
                raise RealPathRefused(f"{shown(path)}: has several hard links; refusing to write")
        except BaseException:
            os.close(fd)
            raise
        return fd, real

    def _written(self, fd: int, real: str, *, whole: bool) -> None:
        st = os.fstat(fd)
        kept = filelabels.label_written(fd, self.taint, whole=whole)
        self.writes.append(((st.st_dev, st.st_ino), kept))
        if self.taint > Sensitivity.INTERNAL:
            self._mark_folders(os.path.dirname(real))

    def _mark_folders(self, folder: str) -> None:
        """The shell of any agent whose workdir holds the file reads it, and
        a later agent may work in a subfolder of this workdir or in a folder
        above it. So every folder from the file's own up to the workdir keeps
        the mark, and above the workdir each folder of the same (non-root)
        owner too (the user's own tree: ~/proj's file is read by an agent in
        ~), stopping at the first folder of another owner (/home, a team
        folder's root-owned parent): another user's agents are not marked.
        Climbed by '..' from a descriptor, as the user; a folder the user
        cannot open, or a file system refusing the attribute, ends it. In the
        host's view (`outside`, when the file was written in the agent's):
        the marks are for later agents, and above the workdir the agent's
        view holds only its scratch; a folder only in a throwaway layer is
        not on the host, and nothing there is marked."""
        opener = self.outside or self.opener
        try:
            top = os.fstat(fd := opener.open(self.index.workdir, os.O_RDONLY | os.O_DIRECTORY))
            os.close(fd)
            dfd = opener.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except (OpenFailed, OSError):
            return
        rel = os.path.relpath(folder, self.index.workdir)
        if rel.startswith(".."):
            return  # not below the workdir: nothing to climb to
        below = 0 if rel == "." else rel.count("/") + 1
        above = False
        try:
            for climbed in range(_MAX_MARK_DEPTH):
                here = os.fstat(dfd)
                if above and (here.st_uid == 0 or here.st_uid != top.st_uid):
                    return
                if not above and climbed > below:
                    return  # the workdir was not met on the way (renamed meanwhile)
                try:
                    filelabels.raise_dir_mark(dfd, self.taint)
                except OSError:
                    return
                if (here.st_dev, here.st_ino) == (top.st_dev, top.st_ino):
                    above = True
                try:
                    up = opener.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=dfd)
                except OpenFailed:
                    return
                os.close(dfd)
                dfd = up
                there = os.fstat(dfd)
                if (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
                    return  # '/' is its own parent
        finally:
            os.close(dfd)

    def write_file(self, path: str, content: str) -> RawJSON:
        fd, real = self._open_write(path, os.O_WRONLY | os.O_CREAT)
        try:
            data = content.encode()
            # A label goes on before the data it covers, so no reader ever
            # sees tainted content unlabelled; it comes off only after.
            raised = self.taint > Sensitivity.INTERNAL
            if raised:
                self._written(fd, real, whole=True)
            os.ftruncate(fd, 0)
            _write_all(fd, data)
            if not raised:
                self._written(fd, real, whole=True)
        finally:
            os.close(fd)
        return RawJSON.of({"path": real, "bytes": len(data)})

    def edit_file(self, path: str, old: str, new: str, replace_all: bool = False) -> RawJSON:
        if not old:
            raise InvalidArgument("edit_file: old text is empty")
        fd, real = self._open_write(path, os.O_RDWR)
        limit = self.limits.edit_max_bytes
        try:
            # An edit keeps the higher of the old and new label: set before.
            self._written(fd, real, whole=False)
            reply = self.opener.edit(fd, old, new, replace_all, limit)
        finally:
            os.close(fd)
        if reply.get("ok"):
            return RawJSON.of({"path": real, "replacements": int(reply.get("replacements", 0))})
        why = reply.get("error")
        if why == "too-large":
            raise too_large("edit_max_bytes", limit, f"{shown(path)} is, or would grow, larger")
        if why == "not-utf8":
            raise InvalidArgument(f"{shown(path)}: not UTF-8 text")
        if why == "several":
            count = int(reply.get("count", 2))
            raise InvalidArgument(f"{shown(path)}: old text occurs {count} times; pass all=true")
        raise InvalidArgument(f"{shown(path)}: old text not found")


def read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 16, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        offset += os.pwrite(fd, view[offset:], offset)


# ---------------------------------------------------------------- web tools


def web_tool(
    tool: str, args: Mapping[str, Any], *, allow_private: bool, max_bytes: int = net.MAX_BODY,
    address: str | None = None,
) -> dict[str, Any]:
    """`address`: the one the gate decided on (resolve.web_call)."""
    url = str(args["url"])
    headers = dict(args.get("headers") or {})
    if tool == "http_post":
        body = str(args["body"]).encode()
        resp = net.request("POST", url, body=body, headers=headers, allow_private=allow_private,
                           follow_redirects=False, max_bytes=max_bytes, address=address)
    else:
        resp = net.request("GET", url, headers=headers, allow_private=allow_private,
                           max_bytes=max_bytes, address=address)
    return resp.as_dict()
