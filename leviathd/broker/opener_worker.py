"""The file worker process (see opener.py). Runs as a script under `python -I
-S` with the agent's uid, gid and groups, inside the agent's own scope;
stdlib only, imports nothing of ours.

It does the work whose cost grows with what the agent asks: resolving and
opening paths, reading and encoding file content, listing folders, edits.
It takes no decision: every descriptor it opens goes to the daemon, which
checks the descriptor's real path and only then hands it back for reading.
Its replies are bounded by the budget the daemon gives with each request.

In the agent's view (issue 43): given a pidfd on PID 1 of the agent's fence
(argv[3], with the user's ids), it starts as root, enters that process's
mount namespace, and only then drops to the user, for good. From then on
every path it opens is resolved as the agent's own processes resolve it: a
file the fence binds read-only is read-only here, a hidden one is not
there, and under a read-only or throwaway workdir the host's tree is not
reachable. The namespace is joined once, before the first request.

Wire format (SOCK_SEQPACKET): a message is one JSON header packet, with
any descriptors, then `header["data"]` bytes in packets of at most CHUNK;
data that fits in one packet with its header follows the header's line in
that packet (one wake-up of the reader instead of two).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import stat
import sys
from typing import Any

CHUNK = 60000
MAX_HEADER = 65536
MAX_LINKS = 40
_PATH = os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW


class Fail(Exception):
    def __init__(self, err: int, where: str | None) -> None:
        super().__init__(err)
        self.errno = err
        self.where = where


def send(sock: socket.socket, header: dict[str, Any], data: bytes = b"",
         fds: list[int] | None = None) -> None:
    header["data"] = len(data)
    head = json.dumps(header).encode()
    if data and len(head) + 1 + len(data) <= CHUNK:
        # One packet, the data after the header's line (json.dumps writes no
        # raw newline): one wake-up of the reader instead of two.
        socket.send_fds(sock, [head, b"\n", data], fds or [])
        return
    socket.send_fds(sock, [head], fds or [])
    view = memoryview(data)
    for start in range(0, len(view), CHUNK):
        sock.send(view[start:start + CHUNK])


def split(raw: bytes, max_data: int) -> tuple[dict[str, Any], int, bytes]:
    """A message's first packet: its header, the size of its data, and the
    part of the data that came in the same packet."""
    line, _, inline = raw.partition(b"\n")
    header = json.loads(line)
    size = int(header.get("data", 0))
    if size > max_data or len(inline) > size:
        raise ValueError(f"message of {max(size, len(inline))} bytes over {max_data}")
    return header, size, inline


def recv(sock: socket.socket, max_data: int) -> tuple[dict[str, Any], bytes, list[int]]:
    raw, fds, _flags, _addr = socket.recv_fds(sock, MAX_HEADER, 2)
    if not raw:
        raise EOFError
    try:
        header, size, inline = split(raw, max_data)
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise
    parts: list[bytes] = [inline]
    got = len(inline)
    while got < size:
        part = sock.recv(CHUNK)
        if not part:
            raise EOFError
        parts.append(part)
        got += len(part)
    return header, b"".join(parts), fds


# ------------------------------------------------------------------ opening


def walk(path: str, flags: int, mode: int, follow: bool) -> int:
    """Open `path` (absolute) one component at a time, following symlinks
    by hand, so that when it fails the failing place is known as a real path
    (`Fail.where`): the daemon tells the agent the error only when that place
    is one it may see, and otherwise one refusal whatever exists there."""
    if not path.startswith("/"):
        raise Fail(errno.EINVAL, None)
    todo = [c for c in reversed(path.split("/")) if c]
    cur = os.open("/", _PATH | os.O_DIRECTORY)
    real = "/"
    links = 0
    try:
        while True:
            if not todo:
                try:
                    return os.open(".", flags | os.O_CLOEXEC, mode, dir_fd=cur)
                except OSError as exc:
                    raise Fail(exc.errno or errno.EIO, real) from None
            name = todo.pop()
            if name == ".":
                continue
            if name == "..":
                up = os.open("..", _PATH | os.O_DIRECTORY, dir_fd=cur)
                os.close(cur)
                cur, real = up, os.path.dirname(real)
                continue
            where = os.path.join(real, name)
            try:
                probe = os.open(name, _PATH, dir_fd=cur)
            except OSError as exc:
                raise Fail(exc.errno or errno.EIO, where) from None
            try:
                st = os.fstat(probe)
            except OSError as exc:
                os.close(probe)
                raise Fail(exc.errno or errno.EIO, where) from None
            if stat.S_ISLNK(st.st_mode) and (todo or follow):
                os.close(probe)
                links += 1
                if links > MAX_LINKS:
                    raise Fail(errno.ELOOP, where)
                try:
                    target = os.readlink(name, dir_fd=cur)
                except OSError as exc:
                    raise Fail(exc.errno or errno.EIO, where) from None
                if target.startswith("/"):
                    root = os.open("/", _PATH | os.O_DIRECTORY)
                    os.close(cur)
                    cur, real = root, "/"
                todo.extend(c for c in reversed(target.split("/")) if c)
                continue
            if not todo:
                os.close(probe)
                try:
                    return os.open(name, flags | os.O_CLOEXEC | os.O_NOFOLLOW, mode, dir_fd=cur)
                except OSError as exc:
                    raise Fail(exc.errno or errno.EIO, where) from None
            if not stat.S_ISDIR(st.st_mode):
                os.close(probe)
                raise Fail(errno.ENOTDIR, where)
            os.close(cur)
            cur, real = probe, where
    finally:
        os.close(cur)


def op_open(req: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], bytes, list[int]]:
    flags, mode = int(req["flags"]), int(req["mode"])
    if fds:
        # One name below a folder the daemon already checked: never followed.
        try:
            opened = os.open(str(req["path"]), flags | os.O_CLOEXEC | os.O_NOFOLLOW, mode,
                             dir_fd=fds[0])
        except OSError as exc:
            raise Fail(exc.errno or errno.EIO, None) from None
    else:
        opened = walk(str(req["path"]), flags, mode, bool(req.get("follow", True)))
    read = req.get("read")
    if isinstance(read, dict):
        # Read ahead, to save the round trip: the daemon throws the content
        # away unless it accepts the descriptor sent with it.
        try:
            if stat.S_ISREG(os.fstat(opened).st_mode):
                reply, out, _ = op_read(read, [opened])
                return {"ok": True, "read": reply}, out, [opened]
        except OSError:
            pass
    return {"ok": True}, b"", [opened]


def _fit(text: str, budget: int) -> tuple[bytes, bool]:
    """`text` as a JSON string literal of at most `budget` bytes, cut if need be."""
    enc = json.dumps(text, ensure_ascii=False).encode()
    cut = False
    while len(enc) > budget and text:
        keep = max(0, min(len(text) - 1, len(text) * (budget - 2) // len(enc)))
        text = text[:keep]
        enc = json.dumps(text, ensure_ascii=False).encode()
        cut = True
    if len(enc) > budget:
        return b"", True
    return enc, cut


def op_read(req: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], bytes, list[int]]:
    limit, budget = int(req["max_bytes"]), int(req["budget"])
    data = os.pread(fds[0], limit + 1, 0)
    over = len(data) > limit
    enc, cut = _fit(data[:limit].decode("utf-8", "replace"), budget)
    if not enc:
        return {"ok": True, "fits": False}, b"", []
    return {"ok": True, "fits": True, "truncated": over or cut}, enc, []


def op_list(req: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], bytes, list[int]]:
    budget = int(req["budget"])
    entries = []
    used = 2
    truncated = False
    with os.scandir(fds[0]) as it:
        for entry in it:
            if entry.is_symlink():
                kind = "symlink"
            elif entry.is_dir(follow_symlinks=False):
                kind = "dir"
            elif entry.is_file(follow_symlinks=False):
                kind = "file"
            else:
                kind = "other"
            item = {"name": entry.name, "type": kind}
            size = len(json.dumps(item, ensure_ascii=False).encode()) + 1
            if used + size > budget:
                truncated = True
                break
            entries.append(item)
            used += size
    entries.sort(key=lambda e: e["name"])
    return ({"ok": True, "truncated": truncated},
            json.dumps(entries, ensure_ascii=False).encode(), [])


def _read_all(fd: int, limit: int) -> bytes | None:
    chunks: list[bytes] = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        offset += len(chunk)
        if offset > limit:
            return None
        chunks.append(chunk)


def op_edit(req: dict[str, Any], fds: list[int], data: bytes
            ) -> tuple[dict[str, Any], bytes, list[int]]:
    fd, limit = fds[0], int(req["max_bytes"])
    args = json.loads(data)
    old, new, replace_all = str(args["old"]), str(args["new"]), bool(args["all"])
    if os.fstat(fd).st_size > limit:
        return {"ok": False, "error": "too-large"}, b"", []
    raw = _read_all(fd, limit)
    if raw is None:
        return {"ok": False, "error": "too-large"}, b"", []
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"ok": False, "error": "not-utf8"}, b"", []
    del raw
    count = text.count(old)
    if count == 0:
        return {"ok": False, "error": "not-found"}, b"", []
    if count > 1 and not replace_all:
        return {"ok": False, "error": "several", "count": count}, b"", []
    out = text.replace(old, new).encode()
    del text
    if len(out) > limit:
        return {"ok": False, "error": "too-large"}, b"", []
    os.ftruncate(fd, 0)
    view = memoryview(out)
    offset = 0
    while offset < len(view):
        offset += os.pwrite(fd, view[offset:], offset)
    return {"ok": True, "replacements": count}, b"", []


def serve(sock: socket.socket, max_data: int) -> None:
    while True:
        try:
            req, data, fds = recv(sock, max_data)
        except (EOFError, OSError, ValueError):
            return
        reply_fds: list[int] = []
        try:
            op = req.get("op")
            if op == "open":
                reply, out, reply_fds = op_open(req, fds)
            elif op == "read":
                reply, out, reply_fds = op_read(req, fds)
            elif op == "list":
                reply, out, reply_fds = op_list(req, fds)
            elif op == "edit":
                reply, out, reply_fds = op_edit(req, fds, data)
            else:
                reply, out = {"ok": False, "errno": errno.EINVAL}, b""
        except Fail as exc:
            reply, out = {"ok": False, "errno": exc.errno, "where": exc.where}, b""
        except OSError as exc:
            reply, out = {"ok": False, "errno": exc.errno or errno.EIO}, b""
        except (ValueError, KeyError, TypeError, IndexError):
            reply, out = {"ok": False, "errno": errno.EINVAL}, b""
        finally:
            for extra in fds:
                os.close(extra)
        try:
            send(sock, reply, out, reply_fds)
        except OSError:
            return
        finally:
            for fd in reply_fds:
                os.close(fd)


_CLONE_NEWNS = 0x00020000
_PR_SET_NO_NEW_PRIVS = 38
_KEYCTL_JOIN_SESSION_KEYRING = 1


def _not_dumpable() -> None:
    # Other processes of the same user may not ptrace this one (or read its
    # memory): it talks to root and holds descriptors for it.
    pr_set_dumpable = 4
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_dumpable, 0, 0, 0, 0)


def enter(spec: dict[str, Any]) -> None:
    """Into the agent's mount namespace, then the user's ids for good (the
    order matters: entering needs root's CAP_SYS_ADMIN). Any failure ends
    the process: it never serves from the host's view by mistake."""
    libc = ctypes.CDLL(None, use_errno=True)
    fence = int(spec["join"])
    if libc.setns(fence, _CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        sys.stderr.write(f"file worker: cannot enter the agent's mounts: {os.strerror(err)}\n")
        os._exit(1)
    os.close(fence)
    # The root is the agent's now: nothing more may be imported (a module
    # planted in a folder the agent writes must never be loaded here).
    sys.path[:] = []
    sys.path_importer_cache.clear()
    uid, gid = int(spec["uid"]), int(spec["gid"])
    os.setgroups([int(g) for g in spec["groups"]])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        os._exit(1)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    keyctl = spec.get("keyctl")
    if isinstance(keyctl, int):
        # A keyring of its own, the user's: nothing of the daemon's session
        # keyring stays in reach (as opener.py does for the host's worker).
        name = f"leviath-files-{os.getpid()}-{os.urandom(8).hex()}".encode()
        if libc.syscall(keyctl, _KEYCTL_JOIN_SESSION_KEYRING, ctypes.c_char_p(name),
                        0, 0, 0) < 0 and ctypes.get_errno() != errno.ENOSYS:
            sys.stderr.write("file worker: cannot join a keyring of its own\n")
            os._exit(1)


if __name__ == "__main__":
    if len(sys.argv) > 3:
        enter(json.loads(sys.argv[3]))
    _not_dumpable()
    serve(socket.socket(fileno=int(sys.argv[1])), int(sys.argv[2]))
