"""The tools themselves. File tools open through the agent's opener (as the
agent's user) and decide on the real path of the opened descriptor; the web
tools are in net.py; `shell` is the daemon's (it runs in the agent's own
sandbox), handed in as a callable.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from leviathd.broker import net
from leviathd.broker.limits import too_large
from leviathd.broker.opener import Opener, OpenFailed
from leviathd.domain.brokerlimits import Limits
from leviathd.domain.credentials import SAFE_PATH, CredentialSpec
from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import AccessDenied, InvalidArgument, LimitExceeded, NotFound, Unavailable
from leviathd.policy import filelabels
from leviathd.policy.readgrant import GrantIndex
from leviathd.sandbox import privileges

MAX_READ = 1 << 20
_READ_FLAGS = os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK  # NONBLOCK: a FIFO cannot hang us
# Room left in a reply, per path still to come, for a short error entry.
_ENTRY_RESERVE = 400
_SHOWN = 200
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
        flags = _READ_FLAGS | (os.O_DIRECTORY if directory else 0)
        content = None
        try:
            if ahead is None:
                fd = self.opener.open(path, flags)
            else:
                fd, content = self.opener.open_read(path, flags, *ahead)
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
        cannot open, or a file system refusing the attribute, ends it."""
        try:
            top = os.fstat(fd := self.opener.open(self.index.workdir,
                                                  os.O_RDONLY | os.O_DIRECTORY))
            os.close(fd)
            dfd = self.opener.open(folder, os.O_RDONLY | os.O_DIRECTORY)
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
                    up = self.opener.open("..", os.O_RDONLY | os.O_DIRECTORY, dir_fd=dfd)
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


def _read_all(fd: int) -> bytes:
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


# --------------------------------------------------------------- credential


def _guarded(uid: int, gid: int, groups: Sequence[int]) -> Callable[[], None]:
    """The credential command's `preexec_fn`: the usual drop to the user
    (privileges.user_command), such that the user cannot read the secret
    from /proc (environ, mem, fd) nor ptrace the process.

    The kernel lets a process of the same uid in only when the caller's gid
    equals the target's real, effective and saved gids, and then only when
    the target is dumpable. So the real gid is one the user cannot take
    (nogroup's, never theirs): the process and every process it execs fail
    the first test, and exec makes them non-dumpable too (real gid !=
    effective gid), which PR_SET_DUMPABLE cannot do across an exec. The
    effective gid stays the user's, so files it writes are the user's as
    ever. (A shell may reset its effective gid to the real one at start;
    all its gids are then nogroup's, which still keeps the user out.)"""
    drop = privileges.user_command(
        uid, gid, groups, real_gid=_NOGROUP if gid != _NOGROUP else _NOGROUP - 1
    )

    def become() -> None:
        drop()
        _set_dumpable(False)

    return become


_NOGROUP = 65534
_PR_SET_DUMPABLE = 4


def _set_dumpable(on: bool) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 1 if on else 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


async def _secret_from_command(
    argv: Sequence[str], *, uid: int, gid: int, groups: Sequence[int], home: str, as_root: bool,
    timeout: float = 30.0,
) -> str:
    """The standard output of `secret_command`, stripped. Its output and
    errors are never shown to the agent: a failure is reported by status."""
    switch: dict[str, Any] = {}
    if as_root:
        switch = {"preexec_fn": privileges.root_command}
    elif os.geteuid() == 0:
        switch = {"preexec_fn": _guarded(uid, gid, groups)}
    elif uid != os.geteuid():
        raise Unavailable("the broker must run as root to act for another user")
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root" if as_root else home,
                 "LANG": "C.UTF-8"},
            cwd="/", **switch,
        )
    except OSError as exc:
        raise NotFound(f"cannot run the credential's secret_command: {exc.strerror}") from None
    except subprocess.SubprocessError:
        raise Unavailable("cannot drop privileges for the credential's secret_command") from None
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise Unavailable(f"secret_command timed out after {timeout:.0f}s") from None
    if proc.returncode != 0:
        raise Unavailable(f"secret_command failed with status {proc.returncode}")
    return out[:MAX_READ].decode("utf-8", "replace").strip()


# A line of a multi-line secret shorter than this is not redacted alone
# (it would blank out common words); the whole secret still is.
MIN_REDACTED_LINE = 6


def redact(text: str, secret: str) -> str:
    """Exact copies of the secret, and of each line of a secret of several
    lines (a program given `a\nb` as its token may print only `a`: seen
    with the wrapped `gh auth token`), longest first."""
    if not secret:
        return text
    parts = {secret, *(ln.strip() for ln in secret.splitlines()
                       if len(ln.strip()) >= MIN_REDACTED_LINE)}
    for part in sorted(parts, key=len, reverse=True):
        text = text.replace(part, "[redacted]")
    return text


@dataclass(frozen=True)
class CredentialRequest:
    """One credential command for the daemon's fence (gate_service.run_credential):
    `env` is its whole environment but HOME/USER/LOGNAME; `stdin` its secret."""

    agent_id: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    stdin: str
    workdir: Literal["none", "ro"]
    timeout: float


CredentialRunner = Callable[[CredentialRequest], Awaitable[Mapping[str, Any]]]
# A secret is handed over in one pipe buffer (gate_shell.MAX_STDIN).
MAX_SECRET = 60 * 1024 - 1


async def run_credential(
    spec: CredentialSpec,
    args: Sequence[str],
    *,
    opener: Opener,
    uid: int,
    gid: int,
    groups: Sequence[int],
    home: str,
    agent_id: str,
    runner: CredentialRunner | None,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Run the configured command with the secret on its standard input (a
    pipe, closed after the secret and a newline), never in its environment
    or arguments. The secret comes from `secret_file` or `secret_command`:
    as root for a credential of the machine config (the admin's secret, which
    the agent's user need not be able to read), as the agent's user for a
    user's own credential (so a user config cannot point it at a file only
    root may read). The command runs as the agent's user through `runner`:
    in the agent's scope, in a fence of its own with a private home and
    working folder and a scrubbed environment (creds/fence.py),
    with a real gid its user cannot take (see `_guarded`); never here,
    outside every fence. The secret is cut out of its output."""
    if spec.kind not in ("command", "cli"):
        raise InvalidArgument(
            f"a credential of kind {spec.kind!r} is not a command: the sandbox's "
            + {"git": "git credential helper", "ssh": "SSH agent"}.get(
                spec.kind, "proxy (injected at the egress)") + " uses it"
        )
    if not spec.command:
        raise Unavailable("credential has no command configured")
    if spec.env:
        raise InvalidArgument(
            f"the credential sets env = {spec.env!r}: secrets no longer reach the command in "
            "its environment (its user could read it from /proc); the command reads the "
            "secret from its standard input instead (see docs/configuration.md)"
        )
    if runner is None:
        raise Unavailable("credential commands need the daemon's fence, which this broker lacks")
    secret = await read_secret(spec, opener=opener, uid=uid, gid=gid, groups=groups, home=home)
    env = {
        "PATH": SAFE_PATH,
        "LANG": "C.UTF-8",
        # git reads no /etc/gitconfig, asks no one, and takes nothing from the
        # agent's folders (the fence shows none of them but a read-only workdir).
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
    }
    argv: tuple[str, ...] = (*spec.command, *args)
    if spec.kind == "cli":
        # The wrapped CLI reads its token from a variable: the fence's shell
        # moves it there from stdin. The variable is as safe as the pipe: the
        # fence's processes are out of its user's reach (`_guarded`), and its
        # PID namespace hides them from the agent. The name was validated.
        argv = ("/bin/sh", "-c", f'IFS= read -r t; {spec.token_env}="$t"; '
                f'export {spec.token_env}; unset t; exec "$@"', "sh", *argv)
    out = await runner(CredentialRequest(
        agent_id, argv, env, secret + "\n", spec.workdir, timeout,
    ))
    return {
        "exit_status": int(out.get("exit_status", -1)),
        "stdout": redact(str(out.get("stdout", ""))[:MAX_READ], secret),
        "stderr": redact(str(out.get("stderr", ""))[:MAX_READ], secret),
    }


async def read_secret(
    spec: CredentialSpec, *, opener: Opener, uid: int, gid: int, groups: Sequence[int],
    home: str,
) -> str:
    """The credential's secret: as root for a credential of the machine
    config, as the agent's user for a user's own (see `run_credential`)."""
    as_root = spec.from_machine and os.geteuid() == 0
    if spec.secret_command:
        secret = await _secret_from_command(
            spec.secret_command, uid=uid, gid=gid, groups=groups, home=home, as_root=as_root
        )
    else:
        try:
            if as_root:
                fd = os.open(spec.secret_file, _READ_FLAGS | os.O_CLOEXEC)
            else:
                fd = await asyncio.to_thread(opener.open, spec.secret_file, _READ_FLAGS)
        except OSError as exc:
            raise NotFound(f"cannot read the credential's secret file: {exc.strerror}") from None
        try:
            secret = (await asyncio.to_thread(_read_all, fd)).decode().strip()
        finally:
            os.close(fd)
    if len(secret.encode()) > MAX_SECRET:
        raise InvalidArgument(f"the credential's secret is larger than {MAX_SECRET} bytes")
    return secret
