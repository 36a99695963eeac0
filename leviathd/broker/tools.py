"""The tools themselves. File tools open through the agent's opener (as the
agent's user) and decide on the real path of the opened descriptor; the web
tools are in net.py; `shell` is the daemon's (it runs in the agent's own
sandbox), handed in as a callable.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from leviathd.broker import net
from leviathd.broker.opener import Opener
from leviathd.errors import AccessDenied, InvalidArgument, NotFound, Unavailable
from leviathd.policy.readgrant import GrantIndex
from leviathd.policy.settings import CredentialSpec
from leviathd.sandbox import privileges

MAX_READ = 1 << 20
_READ_FLAGS = os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK  # NONBLOCK: a FIFO cannot hang us


class RealPathRefused(AccessDenied):
    """The opened file's real path is not allowed (a symlink or a race)."""


@dataclass(frozen=True)
class ShellRequest:
    agent_id: str
    command: str
    timeout: int | None


# The daemon's shell runner: runs `command` inside the agent's own sandbox
# and returns {"exit_status": int, "stdout": str, "stderr": str}.
ShellRunner = Callable[[ShellRequest], Awaitable[Mapping[str, Any]]]


def fd_real_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


class FileTools:
    """read_file, read_files, list_dir, write_file, edit_file for one agent.
    Blocking; the broker runs these in a worker thread."""

    def __init__(self, opener: Opener, index: GrantIndex) -> None:
        self.opener = opener
        self.index = index
        # What this call touched, for the broker's labels: (real path, inode
        # key) of every file or directory read, inode keys of files written.
        self.reads: list[tuple[str, tuple[int, int]]] = []
        self.writes: list[tuple[int, int]] = []

    def _open_read(self, path: str, *, directory: bool = False) -> tuple[int, str]:
        flags = _READ_FLAGS | (os.O_DIRECTORY if directory else 0)
        fd = self.opener.open(path, flags)
        try:
            real = fd_real_path(fd)
            if not self.index.may_read(real):
                raise RealPathRefused(
                    f"{path}: opened file is {real}, outside the workdir and not granted"
                )
            st = os.fstat(fd)
            if not directory and not stat.S_ISREG(st.st_mode):
                raise InvalidArgument(f"{path}: not a regular file")
        except BaseException:
            os.close(fd)
            raise
        self.reads.append((real, (st.st_dev, st.st_ino)))
        return fd, real

    def read_file(self, path: str, max_bytes: int | None = None) -> dict[str, Any]:
        limit = min(max_bytes or MAX_READ, MAX_READ)
        fd, real = self._open_read(path)
        try:
            data = os.pread(fd, limit + 1, 0)
        finally:
            os.close(fd)
        return {
            "path": real,
            "content": data[:limit].decode("utf-8", "replace"),
            "truncated": len(data) > limit,
        }

    def read_files(self, paths: Sequence[str], max_bytes: int | None = None) -> dict[str, Any]:
        files: list[dict[str, Any]] = []
        for path in paths:
            try:
                files.append(self.read_file(path, max_bytes))
            except OSError as exc:
                files.append({"path": path, "error": exc.strerror or str(exc)})
        return {"files": files}

    def list_dir(self, path: str) -> dict[str, Any]:
        fd, real = self._open_read(path, directory=True)
        try:
            entries = []
            with os.scandir(fd) as it:
                for entry in it:
                    if entry.is_symlink():
                        kind = "symlink"
                    elif entry.is_dir(follow_symlinks=False):
                        kind = "dir"
                    elif entry.is_file(follow_symlinks=False):
                        kind = "file"
                    else:
                        kind = "other"
                    entries.append({"name": entry.name, "type": kind})
        finally:
            os.close(fd)
        entries.sort(key=lambda e: e["name"])
        return {"path": real, "entries": entries}

    def _open_write(self, path: str, flags: int) -> tuple[int, str]:
        """Open the parent directory, check its real path is inside the
        workdir, then open the last component relative to that descriptor
        with O_NOFOLLOW: neither a symlinked parent nor a symlinked file can
        take a write outside, and nothing is truncated before the checks."""
        parent, name = os.path.split(path)
        if name in ("", ".", ".."):
            raise InvalidArgument(f"{path}: not a file name")
        dfd = self.opener.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            real_dir = fd_real_path(dfd)
            if not self.index.may_write(real_dir):
                raise RealPathRefused(f"{path}: directory is {real_dir}, outside the workdir")
            fd = self.opener.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644, dir_fd=dfd)
        finally:
            os.close(dfd)
        try:
            real = fd_real_path(fd)
            st = os.fstat(fd)
            if not self.index.may_write(real):
                raise RealPathRefused(f"{path}: opened file is {real}, outside the workdir")
            if not stat.S_ISREG(st.st_mode):
                raise InvalidArgument(f"{path}: not a regular file")
            if st.st_nlink > 1:
                # Another name for the same file may live outside the workdir.
                raise RealPathRefused(f"{path}: has several hard links; refusing to write")
        except BaseException:
            os.close(fd)
            raise
        self.writes.append((st.st_dev, st.st_ino))
        return fd, real

    def write_file(self, path: str, content: str) -> dict[str, Any]:
        fd, real = self._open_write(path, os.O_WRONLY | os.O_CREAT)
        try:
            data = content.encode()
            os.ftruncate(fd, 0)
            _write_all(fd, data)
        finally:
            os.close(fd)
        return {"path": real, "bytes": len(data)}

    def edit_file(self, path: str, old: str, new: str, replace_all: bool = False) -> dict[str, Any]:
        if not old:
            raise InvalidArgument("edit_file: old text is empty")
        fd, real = self._open_write(path, os.O_RDWR)
        try:
            text = _read_all(fd).decode("utf-8")
            count = text.count(old)
            if count == 0:
                raise InvalidArgument(f"{path}: old text not found")
            if count > 1 and not replace_all:
                raise InvalidArgument(f"{path}: old text occurs {count} times; pass all=true")
            data = text.replace(old, new).encode()
            os.ftruncate(fd, 0)
            _write_all(fd, data)
        except UnicodeDecodeError:
            raise InvalidArgument(f"{path}: not UTF-8 text") from None
        finally:
            os.close(fd)
        return {"path": real, "replacements": count}


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


def web_tool(tool: str, args: Mapping[str, Any], *, allow_private: bool) -> dict[str, Any]:
    url = str(args["url"])
    headers = dict(args.get("headers") or {})
    if tool == "http_post":
        body = str(args["body"]).encode()
        resp = net.request("POST", url, body=body, headers=headers, allow_private=allow_private,
                           follow_redirects=False)
    else:
        resp = net.request("GET", url, headers=headers, allow_private=allow_private)
    return resp.as_dict()


# --------------------------------------------------------------- credential


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
        switch = {"preexec_fn": privileges.user_command(uid, gid, groups)}
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


def redact(text: str, secret: str) -> str:
    return text.replace(secret, "[redacted]") if secret else text


async def run_credential(
    spec: CredentialSpec,
    args: Sequence[str],
    *,
    opener: Opener,
    uid: int,
    gid: int,
    groups: Sequence[int],
    home: str,
    workdir: str,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Run the configured command with the secret in `spec.env`. The secret
    comes from `secret_file` or `secret_command`: as root for a credential of
    the machine config (the admin's secret, which the agent's user need not be
    able to read), as the agent's user for a user's own credential (so a user
    config cannot point it at a file only root may read). The command runs as
    the agent's user, outside the sandbox, and the secret is cut out of its
    output."""
    if not spec.command:
        raise Unavailable("credential has no command configured")
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
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "LANG": "C.UTF-8",
        spec.env: secret,
    }
    switch: dict[str, Any] = {}
    if os.geteuid() == 0:
        switch = {"preexec_fn": privileges.user_command(uid, gid, groups)}
    elif uid != os.geteuid():
        raise Unavailable("the broker must run as root to act for another user")
    try:
        proc = await asyncio.create_subprocess_exec(
            *spec.command,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=workdir,
            start_new_session=True,
            **switch,
        )
    except subprocess.SubprocessError:
        raise Unavailable("cannot drop privileges for the credential command") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise InvalidArgument(f"credential command timed out after {timeout:.0f}s") from None
    return {
        "exit_status": proc.returncode,
        "stdout": redact(out[:MAX_READ].decode("utf-8", "replace"), secret),
        "stderr": redact(err[:MAX_READ].decode("utf-8", "replace"), secret),
    }
