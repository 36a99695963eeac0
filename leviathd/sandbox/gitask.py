"""Ask git, as the user, which settings it will read for a folder (issue 48):
`git config --list --show-origin --show-scope -z`, so that includes,
`includeIf`, worktree configs, links and files of any size are read by git's
own rules, never by a reader of ours that git could disagree with.

Git runs as the user (the daemon drops to them first; never root in folders
the user can write), with an environment of our making (no `GIT_*` of the
daemon's, `HOME` the user's, the system config read), bounded in time and
output, on a worker thread (the spec is planned off the event loop).
`-c safe.directory=*` makes git read a repository it would call dubious:
reading settings runs nothing, and protecting what a config names that the
user's git would refuse costs nothing.

`git config --list` runs no program: no hook, fsmonitor, pager or filter is
started by it (it is also given `--no-pager`, and `GIT_PAGER=cat`).
"""

from __future__ import annotations

import os
import posixpath
import selectors
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from leviathd import fsids
from leviathd.errors import Unavailable
from leviathd.sandbox import privileges

GIT = "/usr/bin/git"
TIMEOUT = 10.0
MAX_OUTPUT = 8 << 20
MAX_WORKTREES = 32
MAX_INCLUDE_FILES = 16
MAX_SETTINGS = 20000


@dataclass(frozen=True)
class Setting:
    """One setting as git read it: `origin` the absolute file it came from
    (None: the command line, a blob, stdin)."""

    scope: str
    origin: str | None
    key: str
    value: str | None


@dataclass(frozen=True)
class GitView:
    """What git says about one folder: the repository that holds it (`top`
    None when bare or none), its git folders, the settings it reads there,
    and the admin folders of every linked worktree of that repository."""

    asked: str
    top: str | None = None
    git_dir: str | None = None
    common_dir: str | None = None
    settings: tuple[Setting, ...] = ()
    worktree_admins: tuple[str, ...] = ()
    worktrees: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Runner:
    """How git is run: as `uid`/`gid`/`groups` when the daemon is root."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.home, "LC_ALL": "C",
            "GIT_PAGER": "cat", "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0",
        }

    def run(self, args: Sequence[str]) -> bytes | None:
        """See `call`: the output of a git that said yes, else None."""
        got = self.call(args)
        return got[1] if got is not None and got[0] == 0 else None

    def call(self, args: Sequence[str]) -> tuple[int, bytes] | None:
        """git's exit status and standard output (git saying no: not a
        repository, a config git itself refuses, which the user's git on the
        host refuses too), or None when git is not installed (nothing on the
        host runs git). Raises Unavailable when git could not answer (it could not be
        started as the user, took too long or said too much): what its
        settings name would go unprotected, so the start is refused."""
        if not os.path.exists(GIT):
            return None
        argv = [GIT, "--no-pager", "-c", "safe.directory=*", *args]
        preexec: Callable[[], None] | None = None
        if os.geteuid() == 0:
            preexec = privileges.user_command(self.uid, self.gid, self.groups)
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, env=self.env(), cwd="/", close_fds=True,
                preexec_fn=preexec, start_new_session=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise Unavailable(f"cannot ask git for the settings it reads: {exc}") from None
        return _bounded_output(proc)


def _bounded_output(proc: subprocess.Popen[bytes]) -> tuple[int, bytes]:
    assert proc.stdout is not None
    out = bytearray()
    deadline = time.monotonic() + TIMEOUT
    ok = True
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or len(out) > MAX_OUTPUT:
                ok = False
                break
            if not sel.select(left):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
    proc.stdout.close()
    if not ok:
        proc.kill()  # our own child, by its pid
    try:
        code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        ok = False
    if not ok:
        raise Unavailable(f"git did not say which settings it reads within {TIMEOUT:.0f} s "
                          f"and {MAX_OUTPUT >> 20} MiB")
    return code, bytes(out)


def parse_list(raw: bytes, base: str) -> list[Setting]:
    """`git config --list --show-scope --show-origin -z` (or without the
    scope: `base` then counts, see `ask_file`): records of scope NUL origin
    NUL key LF value NUL; a relative origin is relative to `base`."""
    out: list[Setting] = []
    parts = raw.decode("utf-8", "surrogateescape").split("\0")
    i = 0
    while i + 2 < len(parts) and len(out) < MAX_SETTINGS:
        scope, origin, kv = parts[i], parts[i + 1], parts[i + 2]
        i += 3
        key, nl, value = kv.partition("\n")
        path: str | None = None
        if origin.startswith("file:"):
            path = posixpath.normpath(posixpath.join(base, origin[5:]))
        out.append(Setting(scope, path, key, value if nl else None))
    return out


def _lines(raw: bytes | None) -> list[str]:
    return [] if raw is None else raw.decode("utf-8", "surrogateescape").splitlines()


def ask(runner: Runner, folder: str) -> GitView:
    """What git says about `folder`: its repository, settings and worktrees."""
    # (a bare repository prints its folders, then fails on the top it has not)
    said = runner.call(["-C", folder, "rev-parse", "--path-format=absolute",
                        "--absolute-git-dir", "--git-common-dir", "--show-toplevel"])
    where = _lines(said[1]) if said is not None else []
    if said is not None and said[0] != 0:
        where = where[:2] if len(where) >= 2 else []
    git_dir = where[0] if len(where) >= 2 else None
    common = where[1] if len(where) >= 2 else None
    top = where[2] if len(where) == 3 else None
    raw = runner.run(["-C", folder, "config", "--list", "--show-scope", "--show-origin", "-z"])
    notes: list[str] = []
    if raw is None:
        notes.append(f"git could not list the settings for {folder}")
    settings = parse_list(raw or b"", top or folder)
    settings += _unread_includes(runner, settings, runner.home)
    admins: list[str] = []
    worktrees: list[str] = []
    if common is not None:
        admins = _admin_folders(runner, common)
        worktrees = _worktree_tops(runner, admins)
    return GitView(folder, top, git_dir, common, tuple(settings), tuple(admins),
                   tuple(worktrees), tuple(notes))


def _worktree_tops(runner: Runner, admins: Sequence[str]) -> list[str]:
    """Where each linked worktree is: its admin folder's `gitdir` file names
    the worktree's `.git` file (read with the user's rights)."""
    tops = []
    for admin in admins:
        try:
            with fsids.as_user(runner.uid, runner.gid):
                fd = os.open(posixpath.join(admin, "gitdir"),
                             os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
                try:
                    text = os.read(fd, 4096).decode("utf-8", "surrogateescape")
                finally:
                    os.close(fd)
        except OSError:
            continue
        line = text.strip().splitlines()[0] if text.strip() else ""
        if line.startswith("/") and line.endswith("/.git"):
            tops.append(posixpath.dirname(posixpath.normpath(line)))
    return tops


def include_target(s: Setting, home: str) -> str | None:
    """The file an `include.path` / `includeIf.<cond>.path` names, by git's
    rules (`~/` the home, relative to the including file's folder)."""
    low = s.key.lower()
    if not (low == "include.path" or (low.startswith("includeif.") and low.endswith(".path"))):
        return None
    if not s.value or s.origin is None:
        return None
    v = s.value
    if v.startswith("~/"):
        return posixpath.normpath(posixpath.join(home, v[2:]))
    return posixpath.normpath(posixpath.join(posixpath.dirname(s.origin), v))


def _unread_includes(runner: Runner, settings: list[Setting], home: str) -> list[Setting]:
    """The settings of included files git did not read this time (an
    `includeIf` whose condition does not hold now, `onbranch:` a branch the
    user may check out later), read by git on their own, in turn."""
    read = {s.origin for s in settings}
    todo = [t for s in settings if (t := include_target(s, home)) and t not in read]
    out: list[Setting] = []
    seen: set[str] = set()
    while todo and len(seen) < MAX_INCLUDE_FILES:
        path = todo.pop(0)
        if path in seen or path in read:
            continue
        seen.add(path)
        raw = runner.run(["config", "--list", "--show-scope", "--show-origin", "-z",
                          "--includes", "--file", path])
        if raw is None:
            continue
        got = parse_list(raw, posixpath.dirname(path))
        out += got
        read |= {s.origin for s in got}
        todo += [t for s in got if (t := include_target(s, home)) and t not in read]
    return out


def _admin_folders(runner: Runner, common: str) -> list[str]:
    """`<common>/worktrees/*`: every linked worktree's admin folder, listed
    with the user's rights."""
    base = posixpath.join(common, "worktrees")
    try:
        with fsids.as_user(runner.uid, runner.gid):
            names = sorted(os.listdir(base))[:MAX_WORKTREES]
    except OSError:
        return []
    return [posixpath.join(base, n) for n in names]
