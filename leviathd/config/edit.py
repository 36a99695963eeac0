"""Editing a config file as text: append an `[[allowlist]]` rule.

The rule is appended to the text, so comments and layout survive; the
result is parsed before it replaces the file, and the replacement is atomic
(temporary file, fsync, rename, fsync of the folder). It lives below both
users of it, `lev policy add` and the daemon's PolicyAdd, so the daemon does
not depend on its own client.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from leviathd import fsat
from leviathd.config.load import parse_config
from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import InvalidArgument


def allowlist_block(tool: str, target: str, level: Sensitivity) -> str:
    return (
        "\n[[allowlist]]\n"
        f"tool = {json.dumps(tool)}\n"
        f"target = {json.dumps(target)}\n"
        f"max_sensitivity = \"{level}\"\n"
    )


def append_rule(path: Path, tool: str, target: str, level: Sensitivity) -> None:
    """Append the rule to `path`, refusing to write anything that does not parse."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    if text and not text.endswith("\n"):
        text += "\n"
    new = text + allowlist_block(tool, target, level)
    parse_config(new, str(path))  # raises ConfigError naming file and line
    atomic_write(path, new)


def machine_write_target(path: Path) -> Path:
    """The file a root write to the machine config must replace. A link is
    written through to its target (an admin's linked config stays the one in
    force), but only when every folder down to the target and the target
    itself belong to root and nobody else may write them: root does not
    write where a user could swap something in. Anything else is refused
    with the reason."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    if not stat.S_ISLNK(st.st_mode):
        return path
    real = Path(os.path.realpath(path))
    why = ""
    for folder in [*reversed(real.parents)]:
        fst = os.stat(folder)
        if fst.st_uid != 0 or fst.st_mode & 0o022:
            why = (f"{folder} is not root's alone (owner uid {fst.st_uid}, "
                   f"mode {fst.st_mode & 0o7777:o})")
            break
    if not why:
        try:
            tst = os.lstat(real)
        except FileNotFoundError:
            tst = None
        if tst is not None and (not stat.S_ISREG(tst.st_mode) or tst.st_uid != 0
                                or tst.st_mode & 0o022 or tst.st_nlink != 1):
            why = f"{real} is not a regular file root alone may write"
    if why:
        raise InvalidArgument(
            f"{path} is a link to {real}, and {why}: not writing through it. Add the rule "
            f"to {real} by hand, or make {path} a regular file"
        )
    return real


def atomic_write(path: Path, text: str) -> None:
    """Replace `path` with `text` through fsat (temporary file made by
    descriptor, fsync of the file and of the folder, rename): the one atomic
    write of the code base. The file keeps its mode (0644 when new); a missing
    folder is made."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    dfd, name = fsat.open_parent(str(path.absolute()), create_mode=0o755)
    try:
        fsat.atomic_write_at(dfd, name, text.encode(), mode=mode)
    finally:
        os.close(dfd)
