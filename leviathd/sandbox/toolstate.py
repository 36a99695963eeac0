"""Agent tools keep their state: a tool's state folder or file that is
missing on the host is made, as the user, before the fence is built.

The spec binds a tool's state (~/.claude, ~/.codex, ...) only where it exists
on the host; a first run of a freshly installed tool found none, so what it
wrote (its login, sessions, settings) went to the agent's scratch home and was
gone when the agent ended. So for each tool the user has installed (its
program on the toolchain paths the sandbox shows) or the agent's command
names, the missing entries are made first: folders 0700, files 0600, with the
user's file-system ids, one component at a time under a descriptor on the
home, never through a link. The protected settings inside (protected.py) are
then made and bound read-only by the fence as for any existing state folder.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from leviathd import fsat, fsids


@dataclass(frozen=True)
class Tool:
    name: str
    programs: tuple[str, ...]
    # Under the home; a trailing "/" marks a folder.
    state: tuple[str, ...]


# The agent tools of docs/sandbox.md ("Agent CLIs"); their state entries are
# spec.AGENT_STATE's.
TOOLS: tuple[Tool, ...] = (
    Tool("Claude Code", ("claude",), (".claude/", ".claude.json")),
    Tool("Codex", ("codex",), (".codex/",)),
    Tool("Gemini CLI", ("gemini",), (".gemini/",)),
    Tool("aider", ("aider",), (".aider/",)),
    Tool("opencode", ("opencode",), (".config/opencode/", ".local/share/opencode/")),
)

# Where the installers put the programs (spec.TOOLCHAINS' bin folders).
BIN_DIRS: tuple[str, ...] = (
    ".local/bin",
    ".npm-global/bin",
    ".opencode/bin",
    ".bun/bin",
    ".deno/bin",
    ".volta/bin",
    ".local/share/mise/shims",
)
# nvm: one bin folder per Node version; at most this many are looked at.
NVM_VERSIONS = ".nvm/versions/node"
MAX_NVM_VERSIONS = 32

# What a new state file holds: Claude Code reads ~/.claude.json as JSON.
_FILE_CONTENT = b"{}\n"


@dataclass(frozen=True)
class Missing:
    tool: str
    rel: str  # under the home
    folder: bool
    why: str  # "installed" or "named by the command"


def bin_dirs(home: str, list_dir: Callable[[str], Sequence[str]]) -> list[str]:
    """The toolchain folders a tool's program is looked for in."""
    dirs = [posixpath.join(home, d) for d in BIN_DIRS]
    nvm = posixpath.join(home, NVM_VERSIONS)
    versions = sorted(list_dir(nvm))[:MAX_NVM_VERSIONS]
    dirs += [posixpath.join(nvm, v, "bin") for v in versions]
    return dirs


def missing_state(
    home: str,
    argvs: Iterable[Sequence[str]],
    exists: Callable[[str], bool],
    list_dir: Callable[[str], Sequence[str]],
    hidden: Callable[[str], bool] = lambda _p: False,
) -> list[Missing]:
    """The state entries to make: of each tool that is installed or named by
    one of `argvs` (argv[0]'s last component), those missing on the host and
    not hidden. Pure: the caller answers the questions about the host."""
    named = {posixpath.basename(argv[0]) for argv in argvs if argv}
    dirs: list[str] | None = None
    out: list[Missing] = []
    for tool in TOOLS:
        why = "named by the command" if named & set(tool.programs) else ""
        if not why:
            if dirs is None:
                dirs = bin_dirs(home, list_dir)
            if any(exists(posixpath.join(d, p)) for d in dirs for p in tool.programs):
                why = "installed"
        if not why:
            continue
        for entry in tool.state:
            rel = entry.rstrip("/")
            path = posixpath.join(home, rel)
            if not exists(path) and not hidden(path):
                out.append(Missing(tool.name, rel, entry.endswith("/"), why))
    return out


def _open_parent_as_user(home_fd: int, parts: list[str]) -> int:
    """The folder holding the last of `parts`, walked from `home_fd` one
    component at a time without following a link; missing folders on the way
    are made 0700 (.config, .local/share)."""
    return fsat.walk_at(home_fd, parts[:-1], create_mode=0o700)


def _make(home_fd: int, entry: Missing) -> None:
    parts = entry.rel.split("/")
    parent = _open_parent_as_user(home_fd, parts)
    try:
        name = parts[-1]
        if entry.folder:
            try:
                os.mkdir(name, 0o700, dir_fd=parent)
            except FileExistsError:
                return  # made meanwhile (by the user): theirs as it is
            fd = fsat.open_dir_at(parent, name)
        else:
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600, dir_fd=parent)  # fmt: skip
            except FileExistsError:
                return
            os.write(fd, _FILE_CONTENT)
        try:
            # Exact modes whatever the daemon's umask.
            os.fchmod(fd, 0o700 if entry.folder else 0o600)
        finally:
            os.close(fd)
    finally:
        os.close(parent)


def create_as_user(uid: int, gid: int, home: str, entries: Sequence[Missing]) -> list[str]:
    """Make `entries` under `home` with the user's file-system ids (so the
    kernel checks every step with the user's rights and the new entries are
    theirs). Returns a note per entry that could not be made; nothing raises:
    the agent then starts as before, its writes in scratch."""
    if not entries:
        return []
    notes: list[str] = []
    with fsids.as_user(uid, gid):
        try:
            home_fd = fsat.open_dir(home)
        except OSError as exc:
            return [f"{home}: {exc.strerror}: agent tools' state not made"]
        try:
            st = os.fstat(home_fd)
            if st.st_uid != uid or not stat.S_ISDIR(st.st_mode):
                return [f"{home}: not the user's own folder: agent tools' state not made"]
            for entry in entries:
                try:
                    _make(home_fd, entry)
                except (OSError, ValueError) as exc:
                    why = getattr(exc, "strerror", None) or str(exc)
                    notes.append(f"~/{entry.rel} ({entry.tool}): not made: {why}")
        finally:
            os.close(home_fd)
    return notes


def _list_dir(path: str) -> list[str]:
    """The names in a folder, no link followed at the last step, at most
    4 * MAX_NVM_VERSIONS of them; [] when it cannot be listed."""
    try:
        fd = os.open(path, fsat.DIR_FLAGS)
    except OSError:
        return []
    try:
        names: list[str] = []
        with os.scandir(fd) as it:
            for e in it:
                names.append(e.name)
                if len(names) >= 4 * MAX_NVM_VERSIONS:
                    break
        return names
    except OSError:
        return []
    finally:
        os.close(fd)


def prepare(
    user_uid: int,
    user_gid: int,
    home: str,
    argvs: Iterable[Sequence[str]],
    hidden: Sequence[str],
    authorized: Callable[[], None] = lambda: None,
) -> list[str]:
    """Make what is missing of the tools' state for an agent of this user
    (in a worker thread: it does I/O). `authorized` returns once the caller
    may start the agent (raises otherwise): a refused caller makes nothing.
    Returns notes on what could not be made."""
    from leviathd.sandbox.spec import is_within

    # One switch of the file-system ids for every question (each switch is
    # two system calls through ctypes: ~50 us a path on a loaded machine).
    with fsids.as_user(user_uid, user_gid):
        entries = missing_state(
            posixpath.normpath(home), argvs, os.path.lexists, _list_dir,
            hidden=lambda p: any(is_within(p, h) for h in hidden),
        )
    if not entries:
        return []
    authorized()
    return create_as_user(user_uid, user_gid, home, entries)
