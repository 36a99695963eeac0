"""What an agent sees: a pure value, computed before anything runs.

`build_spec` turns the effective settings, the user, the request and an
execution id into a `SandboxSpec`: the mount table the launcher applies in
order, the hidden paths, the namespaces, the environment, the limits. It does
no I/O of its own: whatever it needs to know about the host (which paths
exist, where links lead, the text of a worktree's `.git` file, the user's git
identity, the system's top-level links) is passed in by the caller, so the
same function runs in unit tests, in `lev inspect` and in the daemon.

The bar is the Legato visibility table (shared/spec/legato-sandbox.md), with a
filesystem isolated from the host's: the launcher builds a root from nothing
but this table.
"""

from __future__ import annotations

import os.path
import posixpath
import pwd
import re
import stat
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal, Protocol

from leviathd import resource_defaults

# A config's `mounts` entry; `Mount` below is one step of building the root.
from leviathd.domain.mounts import MountRequest
from leviathd.domain.sandbox import SandboxKind
from leviathd.domain.workdir import WORKDIR_MODES, WorkdirMode, refuse_system_workdir
from leviathd.errors import InvalidArgument
from leviathd.hidden import HIDDEN_ABSOLUTE, HIDDEN_IN_HOME
from leviathd.identity import UserInfo
from leviathd.sandbox import claudestate, gitask, loopfs, protected
from leviathd.sandbox.environment import build_environment, parse_git_identity
from leviathd.sandbox.gitask import GitView

MountKind = Literal["bind", "tmpfs", "overlay", "proc", "dev", "symlink", "mask", "protect"]

DEFAULT_SCRATCH_DIR = "/var/lib/leviath/scratch"
# An agent's home, /tmp and throwaway layers together (a tmpfs of this size).
DEFAULT_SCRATCH_SIZE = 1 << 30

# The system, read-only. The /bin-style names are links on merged-/usr systems
# and directories elsewhere; the caller says which (see `links`).
SYSTEM_DIRS: tuple[str, ...] = ("/usr", "/etc", "/opt")
SYSTEM_LINK_DIRS: tuple[str, ...] = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

# Home entries, relative to the home folder.
AGENT_STATE: tuple[str, ...] = (
    ".claude",
    ".claude.json",
    ".codex",
    ".chimera",
    ".gemini",
    ".config/opencode",
    ".local/share/opencode",
    ".aider",
    ".aider.conf.yml",
)
TOOLCHAINS: tuple[str, ...] = (
    ".local/bin",
    # What the links in ~/.local/bin lead to: Claude Code's native install,
    # pipx's venvs, npm's global packages under prefix ~/.local.
    ".local/share/claude",
    ".local/share/pipx",
    ".local/lib/node_modules",
    ".npm-global",
    ".opencode/bin",
    ".local/share/mise",
    ".local/share/uv/python",
    ".local/share/uv/tools",
    ".cargo/bin",
    ".rustup",
    "go/bin",
    ".bun/bin",
    ".deno/bin",
    ".nvm",
    ".volta",
    ".pyenv",
    ".sdkman",
)
CACHES: tuple[str, ...] = (
    ".cache/pip",
    ".cache/uv",
    ".npm",
    ".local/share/pnpm",
    ".cache/pnpm",
    ".cache/yarn",
    ".yarn/berry/cache",
    ".bun/install/cache",
    ".cargo/registry",
    ".cargo/git",
    "go/pkg/mod",
    ".cache/go-build",
    ".gradle/caches",
    ".gradle/wrapper",
    ".m2/repository",
    ".cache/deno",
    ".cache/pre-commit",
)
KNOWN_HOSTS = ".ssh/known_hosts"

# Never visible: the one list, shared with the broker (leviathd/hidden.py).


class ResourcesLike(Protocol):
    @property
    def memory_max(self) -> int | None: ...

    @property
    def tasks_max(self) -> int | None: ...

    @property
    def cpu_quota(self) -> int | None: ...

    @property
    def cpu_weight(self) -> int | None: ...


class FolderLike(Protocol):
    """A `[[folders]]` grant (leviathd.config.models.FolderGrant)."""

    @property
    def path(self) -> str: ...

    @property
    def access(self) -> str: ...

    @property
    def agent(self) -> str | None: ...

    @property
    def repository(self) -> str | None: ...


class EffectiveLike(Protocol):
    """The fields of `leviathd.config.merge.Effective` the spec is built from."""

    @property
    def kind(self) -> str: ...

    @property
    def network(self) -> bool | str: ...

    @property
    def mounts(self) -> Sequence[MountRequest]: ...

    @property
    def default_mounts(self) -> bool: ...

    @property
    def scratch_dir(self) -> str | None: ...

    @property
    def resources(self) -> ResourcesLike: ...

    @property
    def env(self) -> Mapping[str, str]: ...

    @property
    def env_pass(self) -> Sequence[str]: ...

    @property
    def env_withhold(self) -> Sequence[str]: ...

    @property
    def hidden_paths(self) -> Sequence[str]: ...

    @property
    def protected_paths(self) -> Sequence[str]: ...

    @property
    def scratch_size(self) -> int | None: ...

    @property
    def allow_io_uring(self) -> bool: ...


class MountRole(StrEnum):
    """What a mount is for, which is what behaviour keys on (`why` is only
    for people): the credential fence keeps SYSTEM (creds/fence.py), a
    container skips SYSTEM and SCRATCH binds (container/settings.py), the
    launcher checks WORKDIR and WORKTREE_GIT sources (namespace/pinner.py)."""

    SYSTEM = "system"  # the read-only system, its links, a fresh /proc, a minimal /dev
    SCRATCH = "scratch"  # home and /tmp, from the agent's scratch
    WORKDIR = "workdir"
    WORKTREE_GIT = "worktree-git"  # a worktree's main git folder
    # One entry of a folder shown entry by entry (a login's folder,
    # proxy/logins.py): one gone by the start is left out, not an error.
    ENTRY = "entry"
    OTHER = "other"


def _legacy_role(why: str) -> MountRole:
    """The role of a mount recorded before roles were (an agent started by an
    older daemon), from the labels that daemon wrote."""
    if why in ("system", "system link", "fresh /proc", "minimal /dev"):
        return MountRole.SYSTEM
    if why in ("home (scratch)", "tmp (scratch)"):
        return MountRole.SCRATCH
    if why.startswith("workdir"):
        return MountRole.WORKDIR
    if why.startswith("worktree git"):
        return MountRole.WORKTREE_GIT
    return MountRole.OTHER


def _mount_from_dict(data: Mapping[str, Any]) -> Mount:
    values = dict(data)
    role = values.get("role")
    values["role"] = _legacy_role(str(values.get("why", ""))) if role is None else MountRole(role)
    return Mount(**values)


@dataclass(frozen=True)
class Mount:
    """One step of building the agent's root, applied in table order.

    bind: `source` (host path) at `target`, read-only when `readonly`.
    tmpfs: an empty file system at `target`.
    overlay: `source` is the lower (host) folder, `upper`/`work` live in scratch.
    proc, dev: a fresh /proc, a minimal /dev.
    symlink: a link at `target` whose text is `source` (/bin -> usr/bin).
    mask: something hidden lies here inside a mounted folder; the launcher
      covers it with an empty read-only file or folder when it exists.
    protect: applied last, in the agent's finished view (links resolve there):
      `target` bound onto itself, read-only when `readonly` (made first when
      missing: `source` is "file" or "dir"), else only pinned against being
      renamed away (see protected.py).
    `exact`: the source must be this very path, not a link to something else
      (used for ~/.ssh/known_hosts, the one entry taken from a hidden folder).
    `role`: what the mount is for, which behaviour keys on; `why`: the
      label people read (`lev inspect`), free to be reworded.
    """

    kind: MountKind
    target: str
    source: str = ""
    readonly: bool = False
    upper: str = ""
    work: str = ""
    exact: bool = False
    why: str = ""
    role: MountRole = MountRole.OTHER


@dataclass(frozen=True)
class RunRequest:
    argv: tuple[str, ...]
    workdir: str
    workdir_mode: WorkdirMode = "rw"
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SandboxSpec:
    kind: SandboxKind
    argv: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str
    workdir_mode: WorkdirMode
    uid: int
    gid: int
    groups: tuple[int, ...]
    user: str
    home: str
    sandbox_home: str
    mounts: tuple[Mount, ...]
    hidden: tuple[str, ...]
    namespaces: tuple[str, ...]
    network: bool
    scratch: str
    hostname: str
    execution_id: str
    limits: Mapping[str, int | None] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    scratch_size: int = DEFAULT_SCRATCH_SIZE
    allow_io_uring: bool = False
    # A real gid the user cannot take, for a command its own user must not
    # read or ptrace (a credential command: broker/credentials.py `_guarded`).
    real_gid: int | None = None
    # network = "proxy": `network` is False (only lo) and the launcher starts
    # the forwarder to the daemon's proxy in the new network namespace.
    proxy: bool = False
    # What holds home, /tmp and the throwaway layers: "ext4", a filesystem of
    # its own on disk (sandbox/loopfs.py), or "tmpfs" (memory; a host
    # without loop devices, and records of agents started before).
    scratch_fs: str = "tmpfs"

    @property
    def scratch_home(self) -> str:
        return posixpath.join(self.scratch, "home")

    @property
    def scratch_tmp(self) -> str:
        return posixpath.join(self.scratch, "tmp")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["env"] = dict(self.env)
        data["limits"] = dict(self.limits)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxSpec:
        values = dict(data)
        values["kind"] = SandboxKind(values["kind"])
        values["argv"] = tuple(values["argv"])
        values["groups"] = tuple(values["groups"])
        values["mounts"] = tuple(_mount_from_dict(m) for m in values["mounts"])
        values["hidden"] = tuple(values["hidden"])
        values["namespaces"] = tuple(values["namespaces"])
        values["notes"] = tuple(values.get("notes", ()))
        values["env"] = dict(values["env"])
        values["limits"] = dict(values.get("limits", {}))
        return cls(**values)


# --- path helpers (pure) -----------------------------------------------------


def is_within(path: str, parent: str) -> bool:
    """`path` is `parent` or lies beneath it (both normalised, absolute)."""
    if parent == "/":
        return True
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def expand(path: str, home: str) -> str:
    """An absolute or `~/` path, normalised. Anything else is refused."""
    if path == "~":
        return posixpath.normpath(home)
    if path.startswith("~/"):
        return posixpath.normpath(posixpath.join(home, path[2:]))
    if not path.startswith("/"):
        raise InvalidArgument(f"path {path!r} must be absolute or start with ~/")
    return posixpath.normpath(path)


_EXECUTION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _as_predicate(existing: Callable[[str], bool] | Collection[str]) -> Callable[[str], bool]:
    if callable(existing):
        return existing
    paths = frozenset(posixpath.normpath(p) for p in existing)
    return paths.__contains__


def hidden_paths(
    user: UserInfo,
    extra: Iterable[str] = (),
    *,
    scratch_dir: str = DEFAULT_SCRATCH_DIR,
    other_homes: Iterable[str] = (),
) -> list[str]:
    """Every path no agent of `user` may see, expanded (not yet resolved)."""
    home = posixpath.normpath(user.home)
    paths = [posixpath.join(home, rel) for rel in HIDDEN_IN_HOME]
    paths += [p.format(uid=user.uid) for p in HIDDEN_ABSOLUTE]
    paths.append(posixpath.normpath(scratch_dir))
    if user.uid != 0:
        paths.append("/root")
    paths += [posixpath.normpath(h) for h in other_homes if posixpath.normpath(h) != home]
    paths += [expand(p, home) for p in extra]
    seen: dict[str, None] = {}
    for p in paths:
        if p != "/" and not is_within(home, p):
            seen.setdefault(p, None)
    return list(seen)


@dataclass
class _Builder:
    user: UserInfo
    home: str
    exists: Callable[[str], bool]
    resolve: Callable[[str], str]
    hidden: list[str]
    mounts: list[Mount] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def hidden_hit(self, path: str) -> str | None:
        """The hidden path that `path` (or where it leads) is at or inside."""
        real = self.resolve(path)
        for h in self.hidden:
            if is_within(path, h) or is_within(real, h):
                return h
        return None

    def add(self, mount: Mount) -> None:
        self.mounts.append(mount)

    def user_bind(self, path: str, *, readonly: bool, why: str, refuse: bool) -> None:
        """Bind a path someone asked for, at the same place. A path at or inside
        a hidden one (after links) is refused when `refuse`, skipped otherwise."""
        if not self.exists(path):
            self.notes.append(f"{path}: not present on this host, not mounted ({why})")
            return
        hit = self.hidden_hit(path)
        if hit is not None:
            if refuse:
                raise InvalidArgument(
                    f"mount {path} ({why}) is refused: it is, or leads to, a place inside "
                    f"the hidden path {hit}"
                )
            self.notes.append(f"{path}: leads into hidden {hit}, not mounted ({why})")
            return
        self.add(Mount("bind", path, self.resolve(path), readonly=readonly, why=why))


def _first_line(text: str | None) -> str:
    return "" if text is None else (text.strip().splitlines() or [""])[0].strip()


def _worktree_git_dirs(
    workdir: str,
    read_text: Callable[[str], str | None],
    exists: Callable[[str], bool],
    resolve: Callable[[str], str],
    refusal: Callable[[str], str | None],
) -> tuple[list[str], list[str]]:
    """The main git folder of a worktree, which git writes to, and notes on
    what was not bound. A `.git` file is a claim that anyone who could write
    the workdir (an agent, last run) may have made, so its `gitdir:` counts
    only when it is a worktree's git folder (HEAD, objects/, refs/, a `gitdir`
    file naming this workdir's `.git`) inside `<main>/worktrees/`, `<main>`
    being what its `commondir` names and a git folder too, and neither is
    refused by `refusal` (the checks a workdir gets)."""
    text = read_text(posixpath.join(workdir, ".git"))
    if text is None or not text.startswith("gitdir:"):
        return [], []
    named = _first_line(text[len("gitdir:") :])
    if not named:
        return [], []
    gitdir = resolve(posixpath.normpath(posixpath.join(workdir, named)))
    if gitdir != workdir and is_within(gitdir, workdir):
        return [], []  # inside the workdir: mounted with it

    def not_bound(why: str) -> tuple[list[str], list[str]]:
        # The .git file is the agent's text: bounded before it is echoed.
        return [], [f"{workdir}/.git names {named[:200]!r}: not bound ({why[:400]})"]

    def git_folder_problem(path: str, needs: tuple[str, ...]) -> str | None:
        why = refusal(path)
        if why is not None:
            return why
        missing = [n for n in needs if not exists(posixpath.join(path, n))]
        if missing:
            return f"{path} is not a git folder (no {', '.join(missing)})"
        return None

    # A worktree's own folder has HEAD; objects/ and refs/ are the main one's.
    why = git_folder_problem(gitdir, ("HEAD", "gitdir", "commondir"))
    if why is not None:
        return not_bound(why)
    back = _first_line(read_text(posixpath.join(gitdir, "gitdir")))
    own = posixpath.join(workdir, ".git")
    if not back or resolve(posixpath.normpath(posixpath.join(gitdir, back))) != own:
        return not_bound(f"its gitdir file does not name {own}")
    common = _first_line(read_text(posixpath.join(gitdir, "commondir")))
    if not common:
        return not_bound("it has no commondir file: not a worktree's")
    main = resolve(posixpath.normpath(posixpath.join(gitdir, common)))
    if not is_within(gitdir, posixpath.join(main, "worktrees")):
        return not_bound(f"it is not inside {main}/worktrees")
    why = git_folder_problem(main, ("HEAD", "objects", "refs"))
    if why is not None:
        return not_bound(why)
    return [main], []


def _depth(path: str) -> int:
    return 0 if path == "/" else path.rstrip("/").count("/")


@dataclass
class _Plan:
    """What the steps of `build_spec` share: the request and the host's
    answers, what follows from them, and the builder gathering the mounts."""

    effective: EffectiveLike
    user: UserInfo
    request: RunRequest
    execution_id: str
    exists: Callable[[str], bool]
    resolve: Callable[[str], str]
    read_text: Callable[[str], str | None]
    links: dict[str, str]
    other_homes: list[str]
    git_identity: Mapping[str, str] | None
    home: str
    scratch: str
    workdir: str
    b: _Builder
    git_dirs: list[str] = field(default_factory=list)
    ask_git: Callable[[str], Sequence[GitView]] = lambda _w: ()
    is_file: Callable[[str], bool] = lambda _p: False
    # The (device, inode) of what a path leads to, as the user; None when
    # it cannot be looked at. A second path to a folder that no link shows
    # (a bind mount of the home elsewhere) is the same folder by this fact.
    file_id: Callable[[str], tuple[int, int] | None] = lambda _p: None


def _system(p: _Plan) -> None:
    """The system, read-only; a fresh /proc and a minimal /dev; a home and a
    /tmp of its own, on disk in scratch."""
    b, exists, resolve = p.b, p.exists, p.resolve
    for path in SYSTEM_DIRS:
        if exists(path):
            b.add(Mount("bind", path, resolve(path), readonly=True, why="system",
                        role=MountRole.SYSTEM))
    for path in SYSTEM_LINK_DIRS:
        if path in p.links:
            b.add(Mount("symlink", path, p.links[path], why="system link",
                        role=MountRole.SYSTEM))
        elif exists(path):
            b.add(Mount("bind", path, resolve(path), readonly=True, why="system",
                        role=MountRole.SYSTEM))
    b.add(Mount("proc", "/proc", why="fresh /proc", role=MountRole.SYSTEM))
    b.add(Mount("dev", "/dev", why="minimal /dev", role=MountRole.SYSTEM))
    b.add(Mount("bind", p.home, posixpath.join(p.scratch, "home"), why="home (scratch)",
                role=MountRole.SCRATCH))
    b.add(Mount("bind", "/tmp", posixpath.join(p.scratch, "tmp"), why="tmp (scratch)",
                role=MountRole.SCRATCH))


def _workdir(p: _Plan) -> None:
    """The workdir (and a worktree's git folders), in the mode asked for."""
    b, home, workdir, resolve = p.b, p.home, p.workdir, p.resolve
    other = [posixpath.normpath(h) for h in p.other_homes]

    def refusal(path: str) -> str | None:
        """Why `path` may not be bound as a workdir or git folder, or None."""
        for q in dict.fromkeys((path, resolve(path))):
            if q == "/" or is_within(home, q) or any(is_within(h, q) for h in other):
                return f"{q} would show the whole home folder"
            if is_within(workdir, q) and q != workdir:
                return f"{q} holds the workdir"
        hit = b.hidden_hit(path)
        if hit is not None:
            return f"{path} is inside the hidden path {hit}"
        return None

    # The daemon's own first check (agents/service.py), here too so that
    # `lev inspect` gives the reason `lev run` gives (`/` is a system folder
    # before it is an ancestor of the home).
    for path in dict.fromkeys((workdir, resolve(workdir))):
        refuse_system_workdir(path, home)
    why = refusal(workdir)
    if why is not None and "whole home" in why:
        raise InvalidArgument(f"workdir {why}; choose a project folder")
    if not p.exists(workdir):
        raise InvalidArgument(f"workdir {workdir} does not exist")
    if why is not None:
        raise InvalidArgument(f"workdir {workdir} is refused: {why}")
    elsewhere = _state_under_another_name(p, workdir)
    if elsewhere is not None:
        raise InvalidArgument(f"workdir {workdir} is refused: {elsewhere}; run the agent in "
                              "it by its own name")
    p.git_dirs, git_notes = _worktree_git_dirs(workdir, p.read_text, p.exists, resolve, refusal)
    b.notes += git_notes
    mode = p.request.workdir_mode
    overlay_index = 0
    shown = [(workdir, "workdir", MountRole.WORKDIR)]
    shown += [(d, "worktree git", MountRole.WORKTREE_GIT) for d in p.git_dirs]
    for path, why, role in shown:
        if mode == "throwaway":
            layer = posixpath.join(p.scratch, "overlay", str(overlay_index))
            overlay_index += 1
            b.add(Mount("overlay", path, resolve(path), upper=posixpath.join(layer, "upper"),
                        work=posixpath.join(layer, "work"), why=f"{why} (throwaway layer)",
                        role=role))
        else:
            b.add(Mount("bind", path, resolve(path), readonly=mode == "ro", why=why, role=role))


def _home_entries(p: _Plan) -> None:
    """Agent tool state, and with default_mounts the toolchains and caches;
    ~/.ssh/known_hosts, the one entry taken from a hidden folder."""
    b, home, exists = p.b, p.home, p.exists
    for rel in AGENT_STATE:
        path = posixpath.join(home, rel)
        if rel == claudestate.CONFIG and exists(path):
            _claude_config(p, path)
        elif exists(path):
            b.user_bind(path, readonly=False, why="agent tool state", refuse=False)
    if p.effective.default_mounts:
        for rel in TOOLCHAINS:
            path = posixpath.join(home, rel)
            if exists(path):
                b.user_bind(path, readonly=True, why="toolchain", refuse=False)
        for rel in CACHES:
            path = posixpath.join(home, rel)
            if exists(path):
                b.user_bind(path, readonly=False, why="cache", refuse=False)
    known_hosts = posixpath.join(home, KNOWN_HOSTS)
    if exists(known_hosts):
        real = p.resolve(known_hosts)
        own = posixpath.join(p.resolve(posixpath.join(home, ".ssh")), "known_hosts")
        leads = next((h for h in b.hidden if is_within(real, h)), None)
        if real == own or leads is None:
            b.add(Mount("bind", known_hosts, real, readonly=True, exact=True, why="known_hosts"))
        else:
            b.notes.append(f"{known_hosts}: leads into hidden {leads}, not mounted")


def _claude_config(p: _Plan, path: str) -> None:
    """~/.claude.json holds MCP server commands next to session state: the
    agent gets the copy made for it (claudestate.py), merged back at its
    end through an allow-list; with no copy (kind none, `lev inspect`, a
    copy that could not be made), the host's file read-only."""
    copy = claudestate.copy_path(p.home, p.execution_id)
    if p.effective.kind != SandboxKind.NONE and p.exists(copy):
        p.b.add(Mount("bind", path, p.resolve(copy), exact=True,
                      why="Claude Code's config: a copy, only session state merged back"))
    else:
        p.b.user_bind(path, readonly=True, refuse=False,
                      why="Claude Code's config (read-only: an agent gets a copy)")


# The kernel's own file systems: a bind of the host's /proc shows every file
# the user's host processes see (/proc/PID/root), /sys and /dev the kernel's
# knobs and devices. Never a config mount or a folder grant, by any name.
KERNEL_FOLDERS = ("/proc", "/sys", "/dev")


def _refuse_asked_mount(p: _Plan, path: str, what: str, *, writable: bool) -> None:
    """A mount someone asked for (config `mounts`, `[[folders]]`) is refused
    when it, or where it leads, is the whole home or holds it (`/`), or lies
    in a kernel file system: decided on the name and on the resolved path,
    so that a link (`~/w/h -> ~`, `~/p -> /proc`) changes nothing."""
    for name in dict.fromkeys((path, p.resolve(path))):
        if is_within(p.home, name):
            raise InvalidArgument(f"{what} would show the whole home folder"
                                  + (f" (it leads to {name})" if name != path else ""))
        top = next((k for k in KERNEL_FOLDERS if is_within(name, k)), None)
        if top is not None:
            raise InvalidArgument(f"{what} is refused: {top} is the kernel's, never mounted "
                                  "into an agent" + (f" (it leads to {name})" if name != path
                                                     else ""))
    shown = _state_under_another_name(p, path)
    if shown is not None:
        raise InvalidArgument(f"{what} is refused: {shown}; mount it by its own name")
    # The same folders by another path that no link shows (a bind mount of
    # the home elsewhere): decided on the folder itself.
    asked = p.file_id(path)
    if asked is not None:
        if asked == p.file_id(p.home):
            raise InvalidArgument(f"{what} would show the whole home folder (it is the home "
                                  "under another path)")
        for rel in AGENT_STATE:
            state = posixpath.join(p.home, rel)
            if not is_within(path, state) and asked == p.file_id(state):
                raise InvalidArgument(f"{what} is refused: it is the agent CLIs' state {state} "
                                      "under another path; mount it by its own name")
    copy = posixpath.join(p.home, claudestate.CONFIG)
    if writable and copy in (path, p.resolve(path)):
        # The agent gets a copy, merged back through an allow-list
        # (claudestate.py): a writable bind over it would hand the host's
        # `mcpServers` (commands the host's claude runs) to the agent.
        raise InvalidArgument(f"{what} is refused writable: the agent gets a copy of "
                              f"~/{claudestate.CONFIG} whose session keys are merged back")


def _state_under_another_name(p: _Plan, path: str) -> str | None:
    """Why `path` would show an agent CLI's state (hooks, settings, logins)
    under another name, or None. The fence protects and covers that state
    where it lies by name; a link to ~/.claude (one the agent made in its
    workdir) would show it writable elsewhere."""
    real = p.resolve(path)
    for rel in AGENT_STATE:
        state = posixpath.join(p.home, rel)
        for place in dict.fromkeys((state, p.resolve(state))):
            if is_within(place, real):  # the state lies inside what is shown
                at = posixpath.normpath(posixpath.join(path, posixpath.relpath(place, real)))
                canonical = state
            elif is_within(real, place):  # what is shown lies inside the state
                at, canonical = path, posixpath.normpath(
                    posixpath.join(state, posixpath.relpath(real, place)))
            else:
                continue
            if at != canonical:
                return (f"it leads to {real}, which shows the agent CLIs' state {state} at "
                        f"{at}, under another name")
    return None


def _config_mounts(p: _Plan) -> None:
    """Extra mounts from config: refused when inside a hidden path."""
    for m in p.effective.mounts:
        path = expand(m.path, p.home)
        if m.access not in ("read", "write"):
            raise InvalidArgument(f"mount {m.path}: access must be read or write")
        _refuse_asked_mount(p, path, f"mount {m.path}", writable=m.access == "write")
        p.b.user_bind(path, readonly=m.access != "write", why="config mount", refuse=True)


def folder_applies(folder: FolderLike, workdir: str, home: str,
                   resolve: Callable[[str], str]) -> bool:
    """A grant for a repository applies when the workdir is the repository's
    folder or inside it, by name or where it leads (the agent's name was
    matched when the configs were merged)."""
    if folder.repository is None:
        return True
    repo = expand(folder.repository, home)
    return any(is_within(w, r) for w in (workdir, resolve(workdir))
               for r in (repo, resolve(repo)))


def _folders(p: _Plan) -> None:
    """`[[folders]]` for this agent, or for agents in the workdir's repository:
    bound like config mounts (refused inside a hidden path, after links)."""
    folders: Sequence[FolderLike] = getattr(p.effective, "folders", ())
    for f in folders:
        if not folder_applies(f, p.workdir, p.home, p.resolve):
            continue
        path = expand(f.path, p.home)
        _refuse_asked_mount(p, path, f"folder {f.path}", writable=str(f.access) == "write")
        who = " and ".join(x for x in (f"agent {f.agent}" if f.agent else "",
                                       f"repository {f.repository}" if f.repository else "")
                           if x)
        p.b.user_bind(path, readonly=str(f.access) != "write", why=f"folder for {who}",
                      refuse=True)


def _protected(p: _Plan) -> None:
    """What git or an agent tool would later run on the host: read-only, even
    inside folders the agent may write. (Kind "none" has no fence to apply
    them in: it lists none.)"""
    b = p.b
    writable_mounts = [
        m for m in b.mounts
        if m.kind == "bind" and not m.readonly and not is_within(m.source, p.scratch)
    ]  # fmt: skip
    extra = protected.refuse_bad(p.effective.protected_paths)
    if p.effective.kind == SandboxKind.NONE or not writable_mounts:
        return  # (nothing to protect: git is not asked)
    candidates = protected.entries(
        home=p.home,
        workdir=p.workdir,
        git=protected.git_folders(p.workdir, p.git_dirs, p.read_text, p.exists, p.resolve),
        extra=extra,
        exists=p.exists,
        views=p.ask_git(p.workdir),
        is_file=p.is_file,
        hook_files_given=[expand(r, p.home)
                          for r in getattr(p.effective, "hook_files_writable", ())],
        read_text=p.read_text,
    )
    for entry in protected.build(
        candidates, writable=[m.target for m in writable_mounts], exists=p.exists,
        hidden=b.hidden_hit, resolve=p.resolve, sources=[m.source for m in writable_mounts],
    ):
        b.add(Mount("protect", entry.path, "dir" if entry.folder else "file",
                    readonly=not entry.pin, why=entry.why))


def _masks(p: _Plan) -> None:
    """Hidden things inside a mounted folder are covered."""
    b = p.b
    masks: dict[str, None] = {}
    for mount in b.mounts:
        if mount.kind not in ("bind", "overlay") or mount.exact:
            continue
        if is_within(mount.source, p.scratch):
            continue
        for h in b.hidden:
            for base in (mount.source, mount.target):
                if h != base and is_within(h, base):
                    masks.setdefault(posixpath.join(mount.target, h[len(base) :].lstrip("/")), None)
    for target in masks:
        b.add(Mount("mask", target, why="hidden"))


# The agent's root, step by step (after nsjail's containProc): each step adds
# mounts (or refuses the request); their order is the order of ties below.
_STEPS: tuple[tuple[str, Callable[[_Plan], None]], ...] = (
    ("system", _system),
    ("workdir", _workdir),
    ("home entries", _home_entries),
    ("config mounts", _config_mounts),
    ("folders", _folders),
    ("protected paths", _protected),
    ("masks", _masks),
)


def _assemble(p: _Plan) -> SandboxSpec:
    """The spec: mounts parents before children (the steps' order breaks
    ties, masks last), namespaces, environment, limits."""
    effective, user, request = p.effective, p.user, p.request
    ordered = sorted(p.b.mounts, key=lambda m: _depth(m.target))
    kind = SandboxKind(effective.kind)
    # Only `true` is the host's network: "proxy" (truthy) must never be read as it.
    host_network = effective.network is True
    namespaces: tuple[str, ...] = ()
    if kind == SandboxKind.NAMESPACE:
        namespaces = ("ipc", "mnt", "pid", "uts") + (() if host_network else ("net",))
    env = build_environment(
        request.env,
        user,
        env_pass=effective.env_pass,
        env_withhold=effective.env_withhold,
        blueprint_env=effective.env,
        git_identity=p.git_identity,
    )
    res = effective.resources
    return SandboxSpec(
        kind=kind,
        argv=tuple(request.argv),
        env=env,
        workdir=p.workdir,
        workdir_mode=request.workdir_mode,
        uid=user.uid,
        gid=user.gid,
        groups=tuple(user.groups),
        user=user.name,
        home=p.home,
        sandbox_home=p.home,
        mounts=tuple(ordered),
        hidden=tuple(p.b.hidden),
        namespaces=tuple(sorted(namespaces)),
        network=host_network,
        scratch=p.scratch,
        hostname=f"leviath-{p.execution_id}"[:64],
        execution_id=p.execution_id,
        limits={
            "memory_max": res.memory_max,
            "tasks_max": res.tasks_max,
            "cpu_quota": res.cpu_quota,
            "cpu_weight": res.cpu_weight,
        },
        notes=tuple(p.b.notes),
        scratch_size=effective.scratch_size or DEFAULT_SCRATCH_SIZE,
        allow_io_uring=effective.allow_io_uring,
        proxy=effective.network == "proxy",
    )


def build_spec(
    effective: EffectiveLike,
    user: UserInfo,
    request: RunRequest,
    execution_id: str,
    *,
    existing: Callable[[str], bool] | Collection[str],
    resolve: Callable[[str], str] | None = None,
    read_text: Callable[[str], str | None] | None = None,
    links: Mapping[str, str] | None = None,
    git_identity: Mapping[str, str] | None = None,
    other_homes: Iterable[str] = (),
    ask_git: Callable[[str], Sequence[GitView]] | None = None,
    is_file: Callable[[str], bool] | None = None,
    file_id: Callable[[str], tuple[int, int] | None] | None = None,
) -> SandboxSpec:
    """Compute what the agent will see.

    existing: which host paths exist (a set, or a predicate).
    resolve: where a host path leads after links (default: itself).
    read_text: the text of a small host file, or None (worktree `.git` files).
    links: the system's top-level links, e.g. {"/bin": "usr/bin"}.
    git_identity: {"name", "email"} from the user's ~/.gitconfig.
    other_homes: other accounts' home folders, hidden too.
    ask_git: what git says about a folder and the repositories that hold or
      share it (gitask.py), as the user.
    is_file: whether a host path is a regular file (a bare word of a git
      command that names one).
    """
    if not _EXECUTION_ID.match(execution_id):
        raise InvalidArgument(f"execution id {execution_id!r} is not a plain name")
    if not request.argv:
        raise InvalidArgument("nothing to run: the command is empty")
    if request.workdir_mode not in WORKDIR_MODES:
        raise InvalidArgument(
            f"workdir mode {request.workdir_mode!r} is not one of {', '.join(WORKDIR_MODES)}"
        )
    exists = _as_predicate(existing)
    resolve_fn: Callable[[str], str] = resolve or posixpath.normpath
    other = list(other_homes)
    home = posixpath.normpath(user.home)
    scratch_dir = posixpath.normpath(effective.scratch_dir or DEFAULT_SCRATCH_DIR)

    declared = hidden_paths(user, effective.hidden_paths, scratch_dir=scratch_dir,
                            other_homes=other)
    # A hidden path is hidden under its own name and wherever it really lives.
    hidden: dict[str, None] = {}
    for h in declared:
        hidden.setdefault(h, None)
        hidden.setdefault(resolve_fn(h), None)
    plan = _Plan(
        effective=effective, user=user, request=request, execution_id=execution_id,
        exists=exists, resolve=resolve_fn, read_text=read_text or (lambda _p: None),
        links=dict(links or {}), other_homes=other, git_identity=git_identity,
        home=home, scratch=posixpath.join(scratch_dir, execution_id),
        workdir=expand(request.workdir, home),
        b=_Builder(user=user, home=home, exists=exists, resolve=resolve_fn, hidden=list(hidden)),
        ask_git=ask_git or (lambda _w: ()), is_file=is_file or (lambda _p: False),
        file_id=file_id or (lambda _p: None),
    )
    for _name, step in _STEPS:
        step(plan)
    return _assemble(plan)


# --- the host's answers, for callers that run on the real machine -----------


def host_exists(path: str) -> bool:
    return os.path.lexists(path)


def host_resolve(path: str) -> str:
    return os.path.realpath(path)


def host_read_text(path: str, limit: int = 65536) -> str | None:
    """A small regular file's text; None for anything else (no links followed
    at the last step, so a planted link cannot make root read a secret)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode("utf-8", "replace")
    finally:
        os.close(fd)


def host_read_text_as(uid: int, gid: int) -> Callable[[str], str | None]:
    """host_read_text with `uid`/`gid` as the file-system ids (when root):
    the user's own files (a workdir's `.git`, the git folder it names, their
    `.gitconfig`) are read with the user's rights, never root's, so a link
    planted on the way cannot make root read for them. fsuid is per thread
    and nothing between the switch and its undoing yields."""
    from leviathd import fsids

    def read(path: str) -> str | None:
        with fsids.as_user(uid, gid):
            return host_read_text(path)

    return read


def host_git_views(user: UserInfo) -> Callable[[str], list[GitView]]:
    """What git, run as `user`, says about a workdir: its repository (one
    that holds it, a monorepo's top above a package), and the linked
    worktrees sharing that repository's git folder that lie in the workdir
    (issue 48)."""
    runner = gitask.Runner(user.uid, user.gid, tuple(user.groups), user.home)

    def ask(workdir: str) -> list[GitView]:
        first = gitask.ask(runner, workdir)
        views = [first]
        # Another worktree's settings name paths relative to its own top:
        # writable only where that top lies in the workdir (`.worktrees/x`
        # in the main one); the admin folders of all are protected anyway.
        inside = [wt for wt in first.worktrees
                  if is_within(wt, workdir) and wt not in (first.top, workdir)]
        for wt in inside[:MAX_WORKTREE_VIEWS]:
            views.append(gitask.ask(runner, wt))
        return views

    return ask


# How many linked worktrees of the workdir's repository git is asked about.
MAX_WORKTREE_VIEWS = 8


def host_is_file_as(uid: int, gid: int) -> Callable[[str], bool]:
    from leviathd import fsids

    def is_file(path: str) -> bool:
        with fsids.as_user(uid, gid):
            try:
                return stat.S_ISREG(os.lstat(path).st_mode)
            except OSError:
                return False

    return is_file


def host_file_id_as(uid: int, gid: int) -> Callable[[str], tuple[int, int] | None]:
    from leviathd import fsids

    def file_id(path: str) -> tuple[int, int] | None:
        with fsids.as_user(uid, gid):
            try:
                st = os.stat(path)
            except OSError:
                return None
            return st.st_dev, st.st_ino

    return file_id


def host_links() -> dict[str, str]:
    links: dict[str, str] = {}
    for path in SYSTEM_LINK_DIRS:
        if os.path.islink(path):
            links[path] = os.readlink(path)
    return links


def host_other_homes(user: UserInfo) -> list[str]:
    homes = {
        posixpath.normpath(p.pw_dir)
        for p in pwd.getpwall()
        if p.pw_dir.startswith(("/home/", "/root", "/var/home/"))
    }
    homes.discard(posixpath.normpath(user.home))
    return sorted(homes)


def build_spec_on_host(
    effective: EffectiveLike,
    user: UserInfo,
    request: RunRequest,
    execution_id: str,
    other_homes: list[str] | None = None,
) -> SandboxSpec:
    """`build_spec` with the answers read from this machine, as the current
    process sees it; the user's own files are read as the user.
    `other_homes`: host_other_homes(user), if the caller has it already."""
    read_text = host_read_text_as(user.uid, user.gid)
    gitconfig = read_text(posixpath.join(user.home, ".gitconfig"))

    spec = build_spec(
        effective,
        user,
        request,
        execution_id,
        existing=host_exists,
        resolve=host_resolve,
        read_text=read_text,
        links=host_links(),
        git_identity=parse_git_identity(gitconfig) if gitconfig else None,
        other_homes=host_other_homes(user) if other_homes is None else other_homes,
        ask_git=host_git_views(user),
        is_file=host_is_file_as(user.uid, user.gid),
        file_id=host_file_id_as(user.uid, user.gid),
    )
    if spec.kind == SandboxKind.NAMESPACE:
        spec = replace(spec, scratch_fs=loopfs.backing())
    return with_default_limits(spec)


def with_default_limits(spec: SandboxSpec) -> SandboxSpec:
    """The spec with this machine's default for each limit no config set
    (leviathd/resource_defaults.py), and a note saying which."""
    filled = resource_defaults.fill(spec.limits)
    unset = [k for k, v in spec.limits.items() if v is None and filled.get(k) is not None]
    notes = spec.notes
    if unset:
        notes += (f"{', '.join(unset)}: not set by any config, so the machine's default "
                  "applies (docs/configuration.md, limits by default)",)  # fmt: skip
    return replace(spec, limits=filled, notes=notes)
