"""What an agent may not write although it lies in a folder it may: the files
through which git or an agent tool would later run code on the host, as the
user, outside any fence (a `core.fsmonitor` in `.git/config`, a hook in
`.git/hooks/`, a `SessionStart` hook in `~/.claude/settings.json`).

The one list lives here; `build_spec` turns it into `protect` mounts, which
the launchers apply once the agent's view is built (leviathd/sandbox/guard.py):

- read-only (`readonly=True`): bound onto itself read-only. A file that is
  missing is first made (empty; `{}` for JSON) so that it cannot be created
  either; a folder that is missing is made empty. Git writes its config as
  `config.lock` renamed over `config`: that rename fails on a mount point.
- pinned (`readonly=False`): a folder that holds protected things (`.git`,
  the workdir's `.claude`) is bound onto itself read-write, so that it cannot
  be renamed away and replaced by one the agent wrote.

A path is protected only where it lies in a host folder the agent may write
(the workdir in `rw` mode, a tool's state folder, a config mount): elsewhere
the agent's writes land in its scratch, or nowhere. Pure: the caller answers
the questions about the host.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from leviathd.domain.protectedpaths import check_config_path, expand_config_path
from leviathd.errors import InvalidArgument
from leviathd.sandbox import gitsettings, toolsettings
from leviathd.sandbox.gitask import GitView

# In every git folder the workdir uses (its own, a worktree's, the common one,
# each submodule's). A trailing "/" marks a folder. `commondir` is read in any
# git folder, a worktree's or not, and would send git to another folder's config.
GIT_FOLDER: tuple[str, ...] = ("config", "config.worktree", "hooks/", "info/", "commondir")

# In every linked worktree's admin folder (`<common>/worktrees/<name>`): what
# sends git to another git folder, or adds settings (issue 48).
WORKTREE_ADMIN: tuple[str, ...] = ("commondir", "gitdir", "config.worktree")

# Tracked files that tools run without being asked (issue 48), at each
# repository's top and the workdir: (any of these there, then all of them).
# husky 9 runs `.husky/<hook>` through `.husky/_`; lefthook merges
# `lefthook-local.yml` in; direnv runs `.envrc`; editors run tasks.
TRACKED_HOOKS: tuple[tuple[str, ...], ...] = (
    (".husky/",),
    ("lefthook.yml", ".lefthook.yml", "lefthook.yaml", ".lefthook.yaml", "lefthook-local.yml",
     ".lefthook-local.yml", ".lefthook/"),
    (".pre-commit-config.yaml",),
    (".simple-git-hooks.json", ".simple-git-hooks.js", ".simple-git-hooks.cjs",
     "simple-git-hooks.json", "simple-git-hooks.js", "simple-git-hooks.cjs"),
    (".envrc",),
    (".vscode/tasks.json",),
    (".devcontainer/",),
)

# In the home, relative to it: hooks, MCP servers, notify and plugin commands;
# git's global configs (a grant of ~/.config must leave them read-only); custom
# agents, commands, skills, rules and instructions the agent CLIs obey, and
# variables they load (issue 45: from the tools' real formats, docs/sandbox.md's
# table). ~/.claude.json is a copy instead (claudestate.py).
HOME: tuple[str, ...] = (
    ".gitconfig",
    ".config/git/config",
    ".claude/settings.json",
    ".claude/settings.local.json",
    ".claude/plugins/",
    ".claude/agents/",
    ".claude/commands/",
    ".claude/skills/",
    ".claude/rules/",
    ".claude/hooks/",
    ".claude/output-styles/",
    ".claude/workflows/",
    ".claude/routines/",
    ".claude/cowork_plugins/",
    ".claude/shell-snapshots/",
    ".claude/session-env/",
    ".claude/backups/",
    ".claude/CLAUDE.md",
    ".claude/AGENTS.md",
    ".claude/scheduled_tasks.json",
    ".claude/launch.json",
    ".claude/daemon.json",
    ".claude/policy-limits.json",
    ".claude/loop.md",
    # Claude Code's local install (`claude migrate-installer`): the host's
    # `claude` alias runs ~/.claude/local/claude.
    ".claude/local/",
    ".codex/config.toml",
    ".codex/hooks.json",
    ".codex/.env",
    ".codex/prompts/",
    ".codex/rules/",
    ".codex/skills/",
    ".codex/agents/",
    ".codex/hooks/",
    ".codex/AGENTS.md",
    ".codex/AGENTS.override.md",
    ".gemini/settings.json",
    ".gemini/.env",
    ".gemini/trustedFolders.json",
    ".gemini/commands/",
    ".gemini/extensions/",
    ".gemini/skills/",
    ".gemini/agents/",
    ".gemini/policies/",
    ".gemini/hooks/",
    ".gemini/GEMINI.md",
    ".config/opencode/opencode.json",
    ".config/opencode/opencode.jsonc",
    ".config/opencode/plugin/",
    ".aider.conf.yml",
)

# In the workdir, per tool: (its state in the home, its folder in the workdir
# or "", the files). Protected when the user has that tool's state in their
# home or the workdir has the tool's folder or files (a user without the tool
# gets no empty folders in their projects).
WORKDIR_TOOLS: tuple[tuple[tuple[str, ...], str, tuple[str, ...]], ...] = (
    ((".claude",), ".claude", (".claude/settings.json", ".claude/settings.local.json")),
    ((".codex",), ".codex", (".codex/config.toml",)),
    ((".gemini",), ".gemini", (".gemini/settings.json",)),
    # aider's lint-cmd/test-cmd run with auto-lint/auto-test
    ((".aider", ".aider.conf.yml"), "", (".aider.conf.yml",)),
)

# How many paths git settings may name (each is a mount or more).
MAX_GIT_NAMED = 256

# How many submodules are looked at, and how deep (a .gitmodules is the agent's text).
MAX_SUBMODULES = 64
MAX_SUBMODULE_DEPTH = 3

_GITMODULES_PATH = re.compile(r"^\s*path\s*=\s*(.+?)\s*$", re.MULTILINE)


def initial_content(name: str) -> bytes:
    """What a missing protected file is made with: nothing, but what its reader
    would otherwise refuse (git dies on an empty `commondir`; "." names the git
    folder itself, as if there were none)."""
    if name == "commondir":
        return b".\n"
    if name.endswith((".json", ".jsonc")):
        return b"{}\n"
    return b""


@dataclass(frozen=True)
class Protected:
    """One entry: `path` absolute, `folder` when it is a folder, `pin` when it is
    only pinned (bound read-write onto itself), `why` for `lev inspect`."""

    path: str
    folder: bool
    pin: bool
    why: str


def _first_line(text: str | None) -> str:
    return "" if text is None else (text.strip().splitlines() or [""])[0].strip()


def submodule_git_folders(
    workdir: str,
    read_text: Callable[[str], str | None],
    exists: Callable[[str], bool],
    resolve: Callable[[str], str],
) -> tuple[list[str], list[str]]:
    """(git folders, `.git` files) of the submodules checked out in the workdir,
    found by reading each `.gitmodules` and each submodule's `.git` file; only
    what lies inside the workdir counts (the rest is not mounted writable)."""
    folders: list[str] = []
    files: list[str] = []
    todo = [(workdir, 0)]
    while todo and len(folders) < MAX_SUBMODULES:
        top, depth = todo.pop()
        text = read_text(posixpath.join(top, ".gitmodules"))
        if text is None or depth >= MAX_SUBMODULE_DEPTH:
            continue
        for rel in _GITMODULES_PATH.findall(text)[:MAX_SUBMODULES]:
            sub = posixpath.normpath(posixpath.join(top, rel.strip('"')))
            if sub == workdir or not _inside(sub, workdir):
                continue
            dotgit = posixpath.join(sub, ".git")
            named = read_text(dotgit)
            if named is not None and named.startswith("gitdir:"):
                gitdir = resolve(posixpath.normpath(posixpath.join(sub, _first_line(named[7:]))))
                files.append(dotgit)
            elif exists(posixpath.join(dotgit, "HEAD")):
                gitdir = dotgit
            else:
                continue
            if _inside(gitdir, workdir) and exists(posixpath.join(gitdir, "HEAD")):
                folders.append(gitdir)
                todo.append((sub, depth + 1))
    return folders, files


def _inside(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def git_folders(
    workdir: str,
    worktree_main: Sequence[str],
    read_text: Callable[[str], str | None],
    exists: Callable[[str], bool],
    resolve: Callable[[str], str],
) -> tuple[list[str], list[str]]:
    """(git folders, `.git` files) of the workdir: its `.git` folder, or the
    worktree folder its `.git` file names and the main one (`worktree_main`,
    already checked by spec._worktree_git_dirs), the common folder a
    `commondir` names, and the submodules'."""
    folders: list[str] = []
    files: list[str] = []
    dotgit = posixpath.join(workdir, ".git")
    text = read_text(dotgit)
    if text is not None and text.startswith("gitdir:"):
        files.append(dotgit)
        if worktree_main:
            named = _first_line(text[len("gitdir:") :])
            folders.append(resolve(posixpath.normpath(posixpath.join(workdir, named))))
            folders += list(worktree_main)
    elif exists(posixpath.join(dotgit, "HEAD")):
        folders.append(dotgit)
        common = _first_line(read_text(posixpath.join(dotgit, "commondir")))
        if common:
            folders.append(resolve(posixpath.normpath(posixpath.join(dotgit, common))))
    subs, subfiles = submodule_git_folders(workdir, read_text, exists, resolve)
    return list(dict.fromkeys(folders + subs)), list(dict.fromkeys(files + subfiles))


def entries(
    *,
    home: str,
    workdir: str,
    git: tuple[Sequence[str], Sequence[str]],
    extra: Iterable[str],
    exists: Callable[[str], bool],
    views: Sequence[GitView] = (),
    is_file: Callable[[str], bool] = lambda _p: False,
    hook_files_given: Sequence[str] = (),
    read_text: Callable[[str], str | None] | None = None,
) -> list[Protected]:
    """Every protected path for this run, before the check that it lies in a
    writable mount (see `build`). With `read_text` (the host's files, read as
    the user), what the agent tools' settings name to run too
    (toolsettings.py). `git` is (git folders, `.git` files);
    `views` what git says about the workdir and the repositories that hold or
    share it (gitask.py): what their settings name (gitsettings.py), their
    git folders and every linked worktree's admin folder, and the tracked
    files that hook managers run at each repository's top (but in the
    repositories of `hook_files_given`, `[sandbox] hook_files_writable`)."""
    out: list[Protected] = []
    folders, files = git
    folders = list(folders)
    out += _git_named(views, home=home, workdir=workdir, is_file=is_file)
    tops = [workdir]
    for view in views:
        folders += [f for f in (view.git_dir, view.common_dir) if f and f not in folders]
        if view.top and view.top not in tops:
            tops.append(view.top)
        for admin in view.worktree_admins:
            out.append(Protected(admin, True, True, "a worktree's git folder (pinned)"))
            for name in WORKTREE_ADMIN:
                out.append(Protected(posixpath.join(admin, name), False, False,
                                     "git: names the git folder"))  # fmt: skip
    for top in tops:
        if any(_inside(top, r) or _inside(workdir, r) for r in hook_files_given):
            continue
        for group in TRACKED_HOOKS:
            if not any(exists(posixpath.join(top, r.rstrip("/"))) for r in group):
                continue
            for rel in group:
                out.append(Protected(posixpath.join(top, rel.rstrip("/")), rel.endswith("/"),
                                     False, "a hook manager runs it"))  # fmt: skip
    for git_dir in folders:
        out.append(Protected(git_dir, True, True, "git folder (pinned)"))
        for name in GIT_FOLDER:
            path = posixpath.join(git_dir, name.rstrip("/"))
            out.append(Protected(path, name.endswith("/"), False, "git: runs code"))
    for f in files:
        out.append(Protected(f, False, False, "git: names the git folder"))
    for rel in HOME:
        out.append(Protected(posixpath.join(home, rel.rstrip("/")), rel.endswith("/"), False,
                             "agent tool: hooks and commands"))  # fmt: skip
    if read_text is not None:
        out += _tool_named(home, workdir, read_text)
    for in_home, in_workdir, rels in WORKDIR_TOOLS:
        mine = [posixpath.join(workdir, p) for p in ((in_workdir,) if in_workdir else rels)]
        if not any(exists(p) for p in [posixpath.join(home, h) for h in in_home] + mine):
            continue
        if in_workdir:
            out.append(Protected(mine[0], True, True, "agent tool folder (pinned)"))
        for rel in rels:
            out.append(Protected(posixpath.join(workdir, rel), False, False,
                                 "agent tool: hooks and commands"))  # fmt: skip
    for value in extra:
        path, folder = expand_config_path(value, home, workdir)
        out.append(Protected(path, folder, False, "[sandbox] protected_paths"))
    return out


def _tool_named(home: str, workdir: str,
                read_text: Callable[[str], str | None]) -> list[Protected]:
    """What the tools' settings name to run, inside their state folders
    (toolsettings.py), and the folders between it and the state folder,
    pinned: renaming `hooks` away and making a new one would sidestep the
    mount of the script."""
    out = []
    for path in toolsettings.named_paths(home, workdir, read_text):
        out.append(Protected(path, False, False, "named by an agent tool's settings: runs"))
        up = posixpath.dirname(path)
        while posixpath.dirname(up) != home and up != home and _inside(up, home):
            out.append(Protected(up, True, True, "holds what a tool setting names (pinned)"))
            up = posixpath.dirname(up)
    return out


def _git_named(
    views: Sequence[GitView], *, home: str, workdir: str, is_file: Callable[[str], bool],
) -> list[Protected]:
    out = []
    found = gitsettings.named_paths(views, home=home, is_file=is_file)
    for named in found[:MAX_GIT_NAMED]:
        # Never the workdir or a folder above it (`hooksPath = .`): the agent
        # must keep writing its work; such a setting is named in the docs' limits.
        if _inside(workdir, named.path) or _inside(home, named.path):
            continue
        out.append(Protected(named.path, named.folder, False, named.why))
        # Its folders up to the workdir are pinned: renaming `tools` away and
        # making a new tools/hooks would otherwise sidestep the mount.
        up = posixpath.dirname(named.path)
        while _inside(up, workdir) and up != workdir:
            out.append(Protected(up, True, True, "holds what a git setting names (pinned)"))
            up = posixpath.dirname(up)
    return out


def build(
    candidates: Iterable[Protected],
    *,
    writable: Sequence[str],
    exists: Callable[[str], bool],
    hidden: Callable[[str], str | None],
    resolve: Callable[[str], str] = posixpath.normpath,
    sources: Sequence[str] = (),
) -> list[Protected]:
    """The entries that lie in a writable host folder (`writable`: their mount
    targets; `sources`, where those really are), by their name and where their
    links lead, not hidden, each once. A missing one whose folder is missing
    too is replaced by that folder's highest missing ancestor, protected as an
    empty folder (nothing can be created beneath it); a pin of something
    missing is dropped (nothing to pin)."""
    chosen: dict[str, Protected] = {}
    every: list[Protected] = []
    for entry in candidates:
        # by its name and where its links lead: a `~/.gitconfig` that links
        # into a dotfiles folder the agent may write (issue 48)
        every.append(entry)
        real = resolve(posixpath.normpath(entry.path))
        if real != posixpath.normpath(entry.path) and not entry.pin:
            every.append(Protected(real, entry.folder, False, entry.why))
    for entry in every:
        path = posixpath.normpath(entry.path)
        # (a file bound on its own, ~/.aider.conf.yml, is its own mount: covered too)
        owner = max((w for w in writable if _inside(path, w) and not (entry.pin and path == w)),
                    key=len, default=None)  # fmt: skip
        if owner is None or hidden(path) is not None:
            continue
        real = resolve(path)
        if not any(_inside(real, w) for w in [*writable, *sources]):
            continue  # (a .git that links out of the workdir: nothing writable there)
        if entry.pin and not exists(path):
            continue
        folder = entry.folder
        probe = path
        while not exists(posixpath.dirname(probe)) and posixpath.dirname(probe) != owner:
            probe = posixpath.dirname(probe)
        if probe != path:
            path, folder = probe, True
        previous = chosen.get(path)
        if previous is None or (previous.pin and not entry.pin):
            chosen[path] = Protected(path, folder, entry.pin, entry.why)
    return list(chosen.values())


def refuse_bad(values: Iterable[str]) -> list[str]:
    out = []
    for v in values:
        try:
            out.append(check_config_path(v))
        except ValueError as exc:
            raise InvalidArgument(f"[sandbox] protected_paths: {exc}") from None
    return out
