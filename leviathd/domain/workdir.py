"""An agent's workdir as every part speaks of it: the modes it may be bound
in, and the system folders that are never one. The bus request
(agents/request.py), the daemon's start (agents/service.py), the pure spec
(sandbox/spec.py, so `lev inspect` gives the reason `lev run` gives) and the
container launcher (sandbox/container/start.py, again on the path it pins)
all check the same list, kept here so none of them imports another for it."""

from __future__ import annotations

import os
from typing import Literal

from leviathd.errors import InvalidArgument

WorkdirMode = Literal["rw", "ro", "throwaway"]
WORKDIR_MODES: tuple[str, ...] = ("rw", "ro", "throwaway")

# Folders of the system that are never an agent's workdir, whatever the kind
# and mode (issue 22): the workdir is bound at its own path, so /etc as a
# workdir would lay the host's /etc (group, shadow...) over the container's.
SYSTEM_FOLDERS = (
    "/etc", "/usr", "/boot", "/efi", "/root", "/proc", "/sys", "/dev", "/run",
    "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/var/lib", "/var/log",
    "/var/cache", "/var/spool", "/var/backups", "/var/mail", "/snap",
)  # fmt: skip
_SYSTEM_EXACT = ("/", "/var")


def refuse_system_workdir(path: str, home: str | None = None) -> None:
    """InvalidArgument when `path` (absolute; checked as given and again as
    resolved) is a system folder or inside one. A folder inside the caller's
    own `home` is allowed wherever that home is (root's is /root)."""
    norm = os.path.normpath(path)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    if home and home != "/" and norm.startswith(os.path.normpath(home).rstrip("/") + "/"):
        return
    if norm in _SYSTEM_EXACT or any(
        norm == top or norm.startswith(top + "/") for top in SYSTEM_FOLDERS
    ):
        raise InvalidArgument(f"workdir {path}: a system folder cannot be an agent's workdir")
