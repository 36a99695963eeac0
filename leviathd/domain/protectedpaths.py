"""The form of a `[sandbox] protected_paths` entry: `~/p` in the home, `/p`
absolute, anything else relative to the workdir; a trailing `/` marks a
folder. The config checks an entry when it loads (config/models.py); the
spec expands it for one run (sandbox/protected.py). One definition on the
ground floor, so the Config need not import the Fence for it."""

from __future__ import annotations

import posixpath


def check_config_path(value: str) -> str:
    """A `[sandbox] protected_paths` entry: `~/p` in the home, `/p` absolute,
    anything else relative to the workdir; a trailing `/` marks a folder."""
    if not value or len(value) > 4096 or "\0" in value or "\n" in value:
        raise ValueError("must be a path of at most 4096 characters")
    body = value[2:] if value.startswith("~/") else value.lstrip("/")
    parts = [p for p in body.rstrip("/").split("/") if p]
    if not parts or any(p in (".", "..") for p in parts) or value in ("~", "~/"):
        raise ValueError(f"{value!r} must name a file or folder (no '.' or '..' parts)")
    return value


def expand_config_path(value: str, home: str, workdir: str) -> tuple[str, bool]:
    folder = value.endswith("/")
    if value.startswith("~/"):
        path = posixpath.join(home, value[2:])
    elif value.startswith("/"):
        path = value
    else:
        path = posixpath.join(workdir, value)
    return posixpath.normpath(path), folder
