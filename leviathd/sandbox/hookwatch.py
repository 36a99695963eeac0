"""What an agent changed in the tracked hook files it was given (issue 48).

`[sandbox] hook_files_writable` gives a repository's hook managers' files
(protected.TRACKED_HOOKS: `.husky/`, `.envrc`, ...) to its agents. They run
on the host, as the user, at the user's next commit or `cd`: what an agent
changed in them is listed when it ends, so the user can read it first.

`snapshot` is taken before the agent runs, `changes` compares it with a second
one at its end. Both read the user's folders as the user (fsids), one entry at
a time by descriptor, never through a link (a link is recorded as a link, by
its target text), bounded in entries and bytes: what lies beyond the bounds is
not compared, and the listing says so. Worker-thread work (it reads disks).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat
from dataclasses import dataclass, field

from leviathd import fsat, fsids
from leviathd.sandbox.protected import TRACKED_HOOKS

# Entries (files, folders, links) looked at, over all tops; bytes hashed.
MAX_ENTRIES = 512
MAX_BYTES = 8 << 20
# How deep a hook folder (`.husky/`, `.devcontainer/`) is walked.
MAX_DEPTH = 6
# How many changed paths are kept (the record, the journal line).
MAX_LISTED = 32
# A file larger than this is compared by size and change time, not content.
MAX_FILE_BYTES = 1 << 20


@dataclass
class Snapshot:
    """path -> what it was ("f:<sha256>", "l:<target>", "d", "s:<size>:<ctime>",
    "?" for anything else); `cut` when a bound was reached."""

    tops: list[str] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)
    cut: bool = False
    _bytes: int = 0


def watched_tops(workdir: str, given: list[str]) -> list[str]:
    """The folders whose hook files the agent was given: the workdir and
    every given repository that holds it (a monorepo's top), as
    protected.entries leaves them writable. None when no given repository
    holds the workdir (its hook files are read-only: nothing to list)."""
    holding = [r for r in given if _inside(workdir, r)]
    inside = [r for r in given if _inside(r, workdir) and r != workdir]
    if not holding and not inside:
        return []
    return list(dict.fromkeys([workdir, *holding, *inside]))[:16]


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def snapshot(uid: int, gid: int, tops: list[str]) -> Snapshot:
    snap = Snapshot(tops=list(tops))
    with fsids.as_user(uid, gid):
        for top in tops:
            try:
                top_fd = fsat.open_dir(top)
            except (OSError, ValueError):
                continue
            try:
                for group in TRACKED_HOOKS:
                    for rel in group:
                        _one(snap, top_fd, top, rel.rstrip("/"), 0)
            finally:
                os.close(top_fd)
    return snap


def _one(snap: Snapshot, dir_fd: int, parent: str, rel: str, depth: int) -> None:
    """The entry `rel` (one or two names: `.vscode/tasks.json`) in `dir_fd`."""
    first, _, rest = rel.partition("/")
    if rest:
        try:
            sub = fsat.open_dir_at(dir_fd, first)
        except (OSError, ValueError):
            return  # (missing, or a link: a link to a folder is not walked)
        try:
            _one(snap, sub, posixpath.join(parent, first), rest, depth)
        finally:
            os.close(sub)
        return
    path = posixpath.join(parent, first)
    st = fsat.lstat_at(dir_fd, first)
    if st is None:
        return
    if len(snap.digests) >= MAX_ENTRIES:
        snap.cut = True
        return
    if stat.S_ISLNK(st.st_mode):
        try:
            snap.digests[path] = "l:" + os.readlink(first, dir_fd=dir_fd)[:4096]
        except OSError:
            snap.digests[path] = "?"
    elif stat.S_ISREG(st.st_mode):
        snap.digests[path] = _file(snap, dir_fd, first, st)
    elif stat.S_ISDIR(st.st_mode):
        snap.digests[path] = "d"
        _folder(snap, dir_fd, path, first, depth + 1)
    else:
        snap.digests[path] = "?"


def _file(snap: Snapshot, dir_fd: int, name: str, st: os.stat_result) -> str:
    if st.st_size > MAX_FILE_BYTES or snap._bytes + st.st_size > MAX_BYTES:
        return f"s:{st.st_size}:{st.st_ctime_ns}"
    try:
        data = fsat.read_at(dir_fd, name, MAX_FILE_BYTES)
    except (OSError, ValueError):
        return f"s:{st.st_size}:{st.st_ctime_ns}"
    snap._bytes += len(data)
    return "f:" + hashlib.sha256(data).hexdigest()


def _folder(snap: Snapshot, dir_fd: int, path: str, name: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        snap.cut = True
        return
    try:
        fd = fsat.open_dir_at(dir_fd, name)
    except (OSError, ValueError):
        return
    try:
        with os.scandir(fd) as it:
            names = []
            for entry in it:
                names.append(entry.name)
                if len(names) > MAX_ENTRIES:
                    snap.cut = True
                    break
        for child in sorted(names):
            _one(snap, fd, path, child, depth)
    except OSError:
        snap.cut = True
    finally:
        os.close(fd)


def changes(before: Snapshot, after: Snapshot) -> tuple[list[str], bool]:
    """(the paths changed, added or removed, each with its change, at most
    MAX_LISTED; whether more may have changed than is listed)."""
    out = []
    for path in sorted(before.digests.keys() | after.digests.keys()):
        old, new = before.digests.get(path), after.digests.get(path)
        if old == new:
            continue
        what = "added" if old is None else "removed" if new is None else "changed"
        out.append(f"{path} ({what})")
    more = before.cut or after.cut or len(out) > MAX_LISTED
    return out[:MAX_LISTED], more
