"""Reading a file that belongs to a user, from a root daemon, without letting
the user point it at something they could not read themselves."""

from __future__ import annotations

import os
import stat

from leviathd import fsat, fsids


def _open_as(path: str, uid: int, gid: int) -> int:
    """os.open as the user: the folders on the way (and any link among them)
    are searched with the user's rights, so a link to a folder of root's
    tells them nothing of what is in it."""
    with fsids.as_user(uid, gid):
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)


def read_user_file(path: str, uid: int, gid: int, *, limit: int = 1 << 20) -> str | None:
    """The file's text, or None when it does not exist. It is opened with the
    user's file-system ids, the last component without following links, and
    the opened file must be a regular file owned by `uid`: a file the user
    owns is one they could read anyway, so a link or hard link to a root-only
    file gives them nothing."""
    try:
        fd = _open_as(path, uid, gid)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PermissionError(f"{path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PermissionError(f"{path}: not a regular file")
        if st.st_uid != uid:
            raise PermissionError(f"{path}: not owned by uid {uid}, ignored")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise PermissionError(f"{path}: larger than {limit} bytes")
        return data.decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def read_noted(dir_fd: int, rel: tuple[str, ...], where: str, limit: int,
               notes: list[str]) -> bytes | None:
    """The regular file `rel` under the user's folder `dir_fd` (opened as
    her), walked by descriptor with no link followed, at most `limit` bytes;
    None when it is absent, or not readable with a note naming `where` (the
    CLIs' logins, proxy/loginfiles.py, and registry logins,
    proxy/registries.py)."""
    try:
        fd = fsat.walk_at(dir_fd, rel[:-1])
    except FileNotFoundError:
        return None
    except OSError as exc:
        notes.append(f"{where}: {exc.strerror or exc}")
        return None
    try:
        st = fsat.lstat_at(fd, rel[-1])
        if st is None:
            return None
        if not stat.S_ISREG(st.st_mode):
            notes.append(f"{where}: not a regular file")
            return None
        return fsat.read_at(fd, rel[-1], limit)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        notes.append(f"{where}: {getattr(exc, 'strerror', None) or exc}")
        return None
    finally:
        os.close(fd)
