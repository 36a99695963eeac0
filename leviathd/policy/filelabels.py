"""Labels kept with the files themselves, so they outlive the agent that wrote
them and the daemon (issue 21).

A file an agent wrote while its taint was above Internal carries that taint
in the extended attribute `trusted.leviath.label`; every broker (any agent,
any user, after any restart) reads it from the descriptor it opened and
labels the read with it. The `trusted.*` namespace is readable and writable
only with CAP_SYS_ADMIN: no user, and no agent, can set, copy or strip it.
Root sets and reads it on descriptors it was handed (never by path).

The workdir folder itself carries the highest label written anywhere in it
(`trusted.leviath.dirty`): the `shell` tool reads whatever it likes there,
so its output carries that mark.

On a file system without `trusted.*` attributes (some FUSE and network file
systems) nothing is kept and the broker's memory is all there is (limits in
docs/security-model.md).
"""

from __future__ import annotations

import contextlib
import errno
import os

from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import InvalidArgument

FILE_LABEL = "trusted.leviath.label"
DIR_MARK = "trusted.leviath.dirty"
_UNSUPPORTED = (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.EACCES)


def _get(fd: int, name: str) -> Sensitivity | None:
    try:
        raw = os.getxattr(fd, name)
    except OSError as exc:
        if exc.errno == errno.ENODATA or exc.errno in _UNSUPPORTED:
            return None
        raise
    try:
        return Sensitivity.parse(raw.decode("ascii", "replace"))
    except InvalidArgument:
        # Only root can have written it; something unreadable is treated as
        # the most sensitive, never as nothing.
        return Sensitivity.PRIVATE


def _set(fd: int, name: str, label: Sensitivity) -> bool:
    try:
        os.setxattr(fd, name, str(label).encode())
    except OSError as exc:
        if exc.errno in _UNSUPPORTED:
            return False
        raise
    return True


def read_label(fd: int) -> Sensitivity | None:
    """The label kept with the open file, or None."""
    return _get(fd, FILE_LABEL)


def label_written(fd: int, taint: Sensitivity, *, whole: bool) -> Sensitivity | None:
    """Keep what an agent at `taint` just wrote into the open file: a whole
    rewrite carries `taint` (Internal or less: the label goes); an edit keeps
    the rest of the old content, so it carries the higher of both. Returns
    the label now kept, or None when the file system keeps none."""
    old = None if whole else read_label(fd)
    label = max(taint, old) if old is not None else taint
    if label <= Sensitivity.INTERNAL:
        with contextlib.suppress(OSError):
            os.removexattr(fd, FILE_LABEL)
        return label
    return label if _set(fd, FILE_LABEL, label) else None


def dir_mark(fd: int) -> Sensitivity | None:
    return _get(fd, DIR_MARK)


def raise_dir_mark(fd: int, label: Sensitivity) -> None:
    """The folder has held data at `label`: its mark only ever goes up."""
    old = _get(fd, DIR_MARK)
    if old is None or label > old:
        _set(fd, DIR_MARK, label)
