"""The agent CLIs' own logins, read on the host and turned into placeholders
of the same shape (issue 45 item 1).

For Claude Code, Codex and Gemini CLI, the login file in the user's state
folder is read by the daemon as the user (her file-system ids, by descriptor
from her home, no link followed, at most MAX_SIZE bytes), and `placeholders`
makes the file an agent sees instead: the same JSON, each secret string (an
access, refresh or ID token, an API key) replaced by a per-agent random value
of the same shape (its vendor prefix kept, a JWT's header and claims kept
with a random signature), with the table from each placeholder to the real
value for the egress to swap back toward the provider's hosts only.
proxy/logins.py binds the file over the real one and gives the table to the
proxy's injector; proxy/refresh.py answers the CLI's token refresh and
writes the new tokens back here (`write_values`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from leviathd import fsat, fsids, userfiles

MAX_SIZE = 64 << 10
MAX_DEPTH = 8
MAX_SECRETS = 32
# At least this many random characters in a placeholder, whatever the shape.
MIN_RANDOM = 32


@dataclass(frozen=True)
class LoginFile:
    tool: str
    rel: tuple[str, ...]  # under the home, one component each
    hosts: tuple[str, ...]  # where the real token may be sent


# From the vendors' files as their CLIs write them (Claude Code's
# `claudeAiOauth`, Codex's `auth.json` with `OPENAI_API_KEY` and `tokens`,
# Gemini CLI's Google OAuth `oauth_creds.json`).
LOGIN_FILES: tuple[LoginFile, ...] = (
    LoginFile("Claude Code", (".claude", ".credentials.json"),
              ("api.anthropic.com", "console.anthropic.com")),
    LoginFile("Codex", (".codex", "auth.json"),
              ("api.openai.com", "chatgpt.com", "auth.openai.com")),
    LoginFile("Gemini CLI", (".gemini", "oauth_creds.json"),
              ("cloudcode-pa.googleapis.com", "generativelanguage.googleapis.com",
               "oauth2.googleapis.com")),
)

# A key whose string value is a secret (`token_type` is "Bearer").
_SECRET_KEY = re.compile(r"token|key|secret|password", re.IGNORECASE)
_NOT_SECRET = frozenset({"token_type", "tokenType"})
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_JWT = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")
# Vendor prefixes kept (the longest that matches): nothing of the secret
# after them, even where it has a `-` of its own.
PREFIXES: tuple[str, ...] = (
    "sk-ant-oat01-", "sk-ant-ort01-", "sk-ant-api03-", "sk-ant-", "sk-proj-", "sk-svcacct-",
    "sk-", "ya29.", "1//", "AIza",
)


@dataclass
class Login:
    tool: str
    hosts: tuple[str, ...]
    placeholder: bytes  # the file an agent would see
    # placeholder -> real value; never logged, never written anywhere.
    real: dict[str, str] = field(default_factory=dict, repr=False)
    # placeholder -> the keys leading to its value in the file (no secret):
    # the egress reads the value there again (`value_at`).
    paths: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _random(n: int, rand: Callable[[int], str]) -> str:
    return rand(max(n, MIN_RANDOM))


def _default_rand(n: int) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(n))


def placeholder_for(value: str, rand: Callable[[int], str] = _default_rand) -> str:
    """A value of the same shape as `value` that shares none of its secret:
    a JWT keeps its header and claims (not secret; the CLI reads them) with a
    random signature; anything else keeps its vendor prefix, the rest
    random, at least MIN_RANDOM characters."""
    if _JWT.match(value):
        head, claims, sig = value.split(".")
        return f"{head}.{claims}.{_random(len(sig), rand)}"
    prefix = max((p for p in PREFIXES if value.startswith(p) and len(p) < len(value)),
                 key=len, default="")
    return prefix + _random(len(value) - len(prefix), rand)


def placeholders(tool: str, hosts: tuple[str, ...], data: bytes,
                 rand: Callable[[int], str] = _default_rand) -> Login | None:
    """The login file with every secret replaced; None when it is not a JSON
    object (nothing then to stand in for)."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    login = Login(tool, hosts, b"")

    def walk(value: Any, depth: int, path: tuple[str, ...]) -> Any:
        if depth > MAX_DEPTH or not isinstance(value, dict):
            return value
        out: dict[str, Any] = {}
        for key, sub in value.items():
            if (isinstance(sub, str) and sub and _SECRET_KEY.search(key)
                    and key not in _NOT_SECRET):
                if len(login.real) >= MAX_SECRETS:
                    raise ValueError("too many secrets in one login file")
                stand_in = placeholder_for(sub, rand)
                login.real[stand_in] = sub
                login.paths[stand_in] = (*path, key)
                out[key] = stand_in
            else:
                out[key] = walk(sub, depth + 1, (*path, key))
        return out

    try:
        shown = walk(doc, 0, ())
    except ValueError:
        return None
    login.placeholder = json.dumps(shown, indent=2).encode() + b"\n"
    return login


def value_at(data: bytes, path: Sequence[str]) -> str | None:
    """The string at `path` in a login file as it is now (the host's CLI
    may have refreshed it since the agent started); None when it is not
    there, not a string, or the file is not JSON."""
    try:
        value: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    for key in path[:MAX_DEPTH + 1]:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value if isinstance(value, str) and value else None


def read_value(uid: int, gid: int, home: str, rel: tuple[str, ...],
               path: Sequence[str]) -> str | None:
    """One value of the user's login file, read as the user (in a worker
    thread) the way `read_logins` reads the file."""
    notes: list[str] = []
    with fsids.as_user(uid, gid):
        try:
            home_fd = fsat.open_dir(home)
        except OSError:
            return None
        try:
            if os.fstat(home_fd).st_uid != uid:
                return None
            data = _read(home_fd, rel, notes)
        finally:
            os.close(home_fd)
    return value_at(data, path) if data is not None else None


def write_values(uid: int, gid: int, home: str, rel: tuple[str, ...],
                 values: Mapping[tuple[str, ...], object]) -> None:
    """Set `values` (keys path -> value) in the user's login file, as the
    user (in a worker thread): by descriptor from her home, no link
    followed, one descriptor on the regular file she owns (at most
    MAX_SIZE read), every other key kept, only into objects the file
    already has. Raises OSError or ValueError (never with a value in it).

    Written as a new file of the same mode renamed over the old one (the
    host's CLIs write it so too): a crash or a reader at that moment sees the
    old file or the new, never half of one. No agent has a mount on this
    name: a fenced agent sees the folder as a tmpfs of its entries with its
    own placeholder file in the login's place (proxy/logins.py), and an
    agent given the folder as it is sees the rename through its bind."""
    with fsids.as_user(uid, gid):
        home_fd = fsat.open_dir(home)
        try:
            if os.fstat(home_fd).st_uid != uid:
                raise ValueError(f"{home}: not the user's own folder")
            dir_fd = fsat.walk_at(home_fd, rel[:-1])
        finally:
            os.close(home_fd)
        try:
            fd = fsat.open_at(dir_fd, rel[-1], os.O_RDWR | os.O_NONBLOCK)
        except BaseException:
            os.close(dir_fd)
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
                raise ValueError(f"~/{'/'.join(rel)}: not the user's regular file")
            if st.st_nlink > 1:
                # A login of several names is not one the daemon keeps: a hard
                # link elsewhere may be one an agent made while the folder
                # was its own (proxy/logins.py refuses such a login too).
                raise ValueError(f"~/{'/'.join(rel)}: has several names (hard links)")
            data = updated(os.pread(fd, MAX_SIZE + 1, 0), st.st_size,
                           f"~/{'/'.join(rel)}", values)
            fsat.atomic_write_at(dir_fd, rel[-1], data, mode=stat.S_IMODE(st.st_mode))
        finally:
            os.close(fd)
            os.close(dir_fd)


def update_in_place(fd: int, label: str, values: Mapping[tuple[str, ...], object]) -> None:
    """Set `values` (keys path -> value) in the JSON object of the regular
    file open at `fd` (at most MAX_SIZE), every other key kept, only into
    objects it already has; written in place (the same inode, for the
    agent's bind over it: its own placeholder file) and synced. ValueError
    names `label`, never a value."""
    data = updated(os.pread(fd, MAX_SIZE + 1, 0), os.fstat(fd).st_size, label, values)
    view = memoryview(data)
    while view:
        view = view[os.pwrite(fd, view, len(data) - len(view)):]
    os.ftruncate(fd, len(data))
    os.fsync(fd)


def updated(raw: bytes, size: int, label: str,
            values: Mapping[tuple[str, ...], object]) -> bytes:
    """The JSON object `raw` (a file of `size` bytes) with `values` set,
    every other key kept, only into objects it already has."""
    if size > MAX_SIZE or len(raw) > MAX_SIZE:
        raise ValueError(f"{label}: over {MAX_SIZE} bytes")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, RecursionError, json.JSONDecodeError):
        raise ValueError(f"{label}: not JSON") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{label}: not a JSON object")
    for path, value in values.items():
        where: Any = doc
        for key in path[:-1][:MAX_DEPTH]:
            where = where.get(key) if isinstance(where, dict) else None
        if not isinstance(where, dict):
            raise ValueError(f"{label}: no object at {'/'.join(path[:-1])}")
        where[path[-1]] = value
    data = json.dumps(doc, indent=2).encode() + b"\n"
    if len(data) > MAX_SIZE:
        raise ValueError(f"{label}: would be over {MAX_SIZE} bytes")
    return data


def matched_by(value: str) -> str:
    """What identifies a placeholder in what the CLI sends: a JWT's random
    signature (its header and claims are the real token's, which change at
    each refresh: the agent's CLI gets the new claims with the same
    signature, so that it sees the new `exp` and decides as on the host),
    any other value whole."""
    return value.split(".")[2] if _JWT.match(value) else value


def read_logins(uid: int, gid: int, home: str,
                rand: Callable[[int], str] = _default_rand) -> tuple[list[Login], list[str]]:
    """The user's logins with their placeholders, read as the user (in a
    worker thread: it does I/O), and notes on what could not be read."""
    logins: list[Login] = []
    notes: list[str] = []
    with fsids.as_user(uid, gid):
        try:
            home_fd = fsat.open_dir(home)
        except OSError as exc:
            return [], [f"{home}: {exc.strerror}"]
        try:
            if os.fstat(home_fd).st_uid != uid:
                return [], [f"{home}: not the user's own folder"]
            for login_file in LOGIN_FILES:
                data = _read(home_fd, login_file.rel, notes)
                if data is None:
                    continue
                login = placeholders(login_file.tool, login_file.hosts, data, rand)
                if login is None:
                    notes.append(f"~/{'/'.join(login_file.rel)}: not a JSON object")
                elif login.real:
                    logins.append(login)
        finally:
            os.close(home_fd)
    return logins, notes


def _read(home_fd: int, rel: tuple[str, ...], notes: list[str]) -> bytes | None:
    return userfiles.read_noted(home_fd, rel, f"~/{'/'.join(rel)}", MAX_SIZE, notes)
