"""Claude Code's `~/.claude.json`: the agent gets a copy, and only session
state comes back (issue 45).

The one file holds what Claude Code writes all the time (start counts, tips,
caches, per-project trust and last session) next to what it later runs or
obeys on the host: `mcpServers` (commands), `env` (variables of every later
run), a project's `allowedTools` and `mcpServers`, approvals of API keys and
of CLAUDE.md includes. Bound read-write, an agent's edit of any of these
would reach the user's next `claude` outside every fence.

So before the fence is built the daemon copies the host's file, as the user,
to `~/.local/state/leviath/claude/<agent>.json` (a place no agent sees), and
the fence binds that copy at `~/.claude.json`. When the agent ends, the
daemon, as the user (her file-system ids, every step by descriptor, no link
followed, sizes bounded), reads the copy and the host's file as it is then,
takes from the copy only the keys of `merge` below, writes the result over
the host's file (a new file renamed into place), drops the copy, and names
in the journal what it left out.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from leviathd import fsat, fsids, safetext

CONFIG = ".claude.json"
# Under the home, one component at a time; made 0700 as the user.
COPIES = (".local", "state", "leviath", "claude")
# Claude Code's file grows with every project (users report 10+ MB).
MAX_SIZE = 32 << 20
_AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

# Top-level keys that come back: counters, onboarding and tips, caches, the
# account record (no secret: the tokens live in ~/.claude/.credentials.json).
# (Read from Claude Code 2.1.332's defaults and what it writes at a first
# start.) Migration markers (`migrationVersion`, `*MigrationComplete`) do not:
# a migration inside could not rewrite the read-only settings, so the host's
# Claude Code runs it itself.
TOP_KEYS = frozenset({
    "numStartups", "firstStartTime", "firstStartVersion", "userID", "machineID",
    "tipsHistory", "oauthAccount", "changelogLastFetched", "seenNotifications",
    "pluginUsage", "fallbackAvailableWarningThreshold",
})
TOP_PREFIXES = ("cached", "hasSeen", "hasUsed", "hasCompleted", "hasOpened", "last", "num")
TOP_SUFFIXES = ("Count", "BeenShown")
# A per-project entry: only for the agent's workdir (or a folder inside it).
PROJECT_KEYS = frozenset({
    "hasTrustDialogAccepted", "projectOnboardingSeenCount", "hasCompletedProjectOnboarding",
    "hasClaudeMdExternalIncludesWarningShown", "exampleFiles", "exampleFilesGeneratedAt",
    "history",
})
PROJECT_PREFIXES = ("last",)
# Keys Claude Code 2.1.332 knows (its defaults) that are left out on purpose:
# preferences set with /config (the host's stay as they are) and what runs
# or is obeyed. tests/unit/test_claudestate_keys.py fails when the installed
# Claude Code knows a key that is neither here nor allowed above.
LEFT_OUT = frozenset({
    "installMethod", "autoUpdates", "theme", "preferredNotifChannel", "verbose", "editorMode",
    "autoCompactEnabled", "autoScrollEnabled", "showTurnDuration", "externalEditorContext",
    "showMessageTimestamps", "queuedCommandUpHintCount", "diffTool", "customApiKeyResponses",
    "env", "todoFeatureEnabled", "showExpandedTodos", "briefTranscript",
    "messageIdleNotifThresholdMs", "autoConnectIde", "autoInstallIdeExtension",
    "fileCheckpointingEnabled", "terminalProgressBarEnabled", "respectGitignore",
    "copyFullResponse", "mcpServers",
})
PROJECT_LEFT_OUT = frozenset({
    "allowedTools", "mcpContextUris", "mcpServers", "enabledMcpjsonServers",
    "disabledMcpjsonServers", "hasClaudeMdExternalIncludesApproved",
})
# Never, whatever the name looks like: approvals and permissions.
_NEVER = re.compile(r"accept|approv|allow|permi|bypass|danger|trust|mcp|hook|command|env|"
                    r"optin|automode|migration", re.IGNORECASE)


def _top_allowed(key: str) -> bool:
    if key in TOP_KEYS:
        return True
    return (key.startswith(TOP_PREFIXES) or key.endswith(TOP_SUFFIXES)) and not _NEVER.search(key)


def _project_allowed(key: str) -> bool:
    return key in PROJECT_KEYS or (key.startswith(PROJECT_PREFIXES) and not _NEVER.search(key))


def _within(path: str, parent: str) -> bool:
    parent = parent.rstrip("/") or "/"
    return path == parent or path.startswith(parent + "/")


@dataclass(frozen=True)
class Merged:
    result: dict[str, Any]
    dropped: list[str]  # what the copy changed and does not come back


def merge(host: Mapping[str, Any], copy: Mapping[str, Any], workdir: str) -> Merged:
    """The host's file as it is now, with the session keys the agent's copy
    holds. Pure. `dropped` names each key of the copy that differs from the
    host's and was left out."""
    out = dict(host)
    dropped: list[str] = []
    for key, value in copy.items():
        if key == "projects":
            continue
        if _top_allowed(key):
            out[key] = value
        elif host.get(key) != value:
            dropped.append(key)
    projects = copy.get("projects")
    if isinstance(projects, dict):
        host_projects = host.get("projects")
        new_projects = dict(host_projects) if isinstance(host_projects, dict) else {}
        workdir = posixpath.normpath(workdir)
        for path, entry in projects.items():
            before = new_projects.get(path)
            before = before if isinstance(before, dict) else {}
            if not isinstance(entry, dict) or not _within(posixpath.normpath(path), workdir):
                if entry != before and (entry or path in new_projects):
                    dropped.append(f"projects[{path}]")
                continue
            merged = dict(before)
            for key, value in entry.items():
                if _project_allowed(key):
                    merged[key] = value
                elif before.get(key) != value:
                    dropped.append(f"projects[{path}].{key}")
            if merged or path in new_projects:
                new_projects[path] = merged
        out["projects"] = new_projects
    elif "projects" in copy and copy["projects"] != host.get("projects"):
        dropped.append("projects")
    return Merged(out, dropped)


def copy_name(agent_id: str) -> str:
    if not _AGENT_ID.match(agent_id):
        raise ValueError(f"agent id {agent_id!r} is not a plain name")
    return f"{agent_id}.json"


def copy_path(home: str, agent_id: str) -> str:
    return posixpath.join(home, *COPIES, copy_name(agent_id))


def _open_copies(home_fd: int, *, create: bool) -> int:
    return fsat.walk_at(home_fd, COPIES, create_mode=0o700 if create else None)


def _open_home(home: str, uid: int) -> int:
    fd = fsat.open_dir(home)
    st = os.fstat(fd)
    if st.st_uid != uid or not stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise OSError(0, "not the user's own folder")
    return fd


def _read_config(home_fd: int) -> bytes | None:
    """The host's file (None when it is not there); a link in its place,
    or anything but a regular file, raises."""
    try:
        return fsat.read_at(home_fd, CONFIG, MAX_SIZE)
    except FileNotFoundError:
        return None


def make_copy(uid: int, gid: int, home: str, agent_id: str,
              authorized: Callable[[], None] = lambda: None) -> str | None:
    """Copy the host's ~/.claude.json for this agent, as the user, once
    `authorized` returned (it raises for a refused caller: nothing is made;
    it is asked only when there is a file to copy, outside the switch of
    file-system ids). Returns a note when the copy could not be made (the
    fence then binds the host's file read-only); None when done or when
    there is no file to copy."""
    name = copy_name(agent_id)
    with fsids.as_user(uid, gid):
        if not _has_config(home, uid):
            return None
    authorized()
    with fsids.as_user(uid, gid):
        try:
            home_fd = _open_home(home, uid)
        except OSError as exc:
            return f"{home}: {exc.strerror}: no copy of ~/{CONFIG} made"
        try:
            data = _read_config(home_fd) or b"{}\n"
            copies = _open_copies(home_fd, create=True)
            try:
                fsat.atomic_write_at(copies, name, data, mode=0o600)
            finally:
                os.close(copies)
        except (OSError, ValueError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            return f"~/{CONFIG}: no copy made for agent {agent_id}: {why}"
        finally:
            os.close(home_fd)
    return None


def _has_config(home: str, uid: int) -> bool:
    try:
        home_fd = _open_home(home, uid)
    except OSError:
        return True  # (said by the copy's own attempt)
    try:
        return fsat.lstat_at(home_fd, CONFIG) is not None
    finally:
        os.close(home_fd)


def _decode(data: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def merge_back(uid: int, gid: int, home: str, agent_id: str, workdir: str,
               log: Callable[[str], None]) -> None:
    """At the agent's end (in a worker thread): its copy's session keys into
    the host's ~/.claude.json, as the user; the copy is removed. Every
    failure is a journal line (`log`), never an exception: the end goes on."""
    try:
        name = copy_name(agent_id)
    except ValueError:
        return
    with fsids.as_user(uid, gid):
        try:
            home_fd = _open_home(home, uid)
        except OSError:
            return
        try:
            try:
                copies = _open_copies(home_fd, create=False)
            except (FileNotFoundError, NotADirectoryError):
                return
            try:
                try:
                    raw = fsat.read_at(copies, name, MAX_SIZE)
                except FileNotFoundError:
                    return
                note = _merge_into_host(home_fd, raw, workdir)
                fsat.unlink_at(copies, name)
            finally:
                os.close(copies)
            if note:
                log(f"agent {agent_id}: ~/{CONFIG}: {note}")
        except (OSError, ValueError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            log(f"agent {agent_id}: ~/{CONFIG}: its copy not merged back: {why}")
        finally:
            os.close(home_fd)


def _merge_into_host(home_fd: int, raw: bytes, workdir: str) -> str:
    """The merge itself; returns the journal's note ("" for none)."""
    copy = _decode(raw)
    if copy is None:
        return "the agent's copy is not a JSON object: nothing of it merged back"
    host_raw = _read_config(home_fd)
    host = _decode(host_raw) if host_raw is not None else {}
    if host is None:
        return "the host's file is not a JSON object now: the agent's copy not merged back"
    merged = merge(host, copy, workdir)
    if merged.result != host:
        mode = 0o600
        with contextlib.suppress(OSError):
            st = os.stat(CONFIG, dir_fd=home_fd, follow_symlinks=False)
            mode = stat.S_IMODE(st.st_mode)
        # Compact: Python's indenting encoder is pure Python (seconds for a
        # file of some MB); Claude Code indents it again at its next save.
        data = json.dumps(merged.result, ensure_ascii=False).encode() + b"\n"
        fsat.atomic_write_at(home_fd, CONFIG, data, mode=mode)
    if merged.dropped:
        # The agent chose these names: each escaped and cut (journal.record
        # bounds the whole line too).
        shown = ", ".join(safetext.escape(d, 120) for d in merged.dropped[:20])
        more = f" and {len(merged.dropped) - 20} more" if len(merged.dropped) > 20 else ""
        return f"left out what the agent wrote to {shown}{more} (only session state comes back)"
    return ""
