"""Re-read the machine configuration when its file changes (inotify), so the
next `lev run` after an edit uses it without a restart. The folder is watched,
not the file: editors and `lev policy` replace files by renaming. inotify
through libc (leviathd/inotify.py): the packaged daemon has it too."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from leviathd import inotify

log = logging.getLogger(__name__)


class ConfigWatcher:
    def __init__(
        self, path: str, on_change: Callable[[], None], *, settle: float = 0.1,
        suffix: str = "",
    ) -> None:
        """`suffix`: watch every file of the folder `path` whose name ends so
        (rules.d's `.toml`) instead of the one file `path`."""
        self._path = path if not suffix else os.path.join(path, "")
        self._name = os.path.basename(path) if not suffix else ""
        self._suffix = suffix
        self._on_change = on_change
        self._settle = settle
        self._inotify: int | None = None
        self._pending: asyncio.TimerHandle | None = None

    def start(self) -> None:
        folder = os.path.dirname(self._path) or "."
        mask = (inotify.IN_CLOSE_WRITE | inotify.IN_MOVED_TO | inotify.IN_CREATE
                | inotify.IN_DELETE | inotify.IN_MOVED_FROM | inotify.IN_ONLYDIR)
        try:
            os.makedirs(folder, mode=0o755, exist_ok=True)
            fd = inotify.init()
        except OSError as exc:
            log.warning("not watching %s for changes (%s); use `systemctl reload leviathd`",
                        self._path, exc)
            return
        try:
            inotify.add_watch(fd, folder, mask)
        except OSError as exc:
            os.close(fd)
            log.warning("not watching %s for changes (%s); use `systemctl reload leviathd`",
                        self._path, exc)
            return
        self._inotify = fd
        asyncio.get_running_loop().add_reader(fd, self._readable)

    def _readable(self) -> None:
        assert self._inotify is not None
        events = inotify.read(self._inotify)
        # An overflow lost names: any of them may have been ours.
        if not any(ev.mask & inotify.IN_Q_OVERFLOW
                   or (ev.name == self._name if not self._suffix
                       else ev.name.endswith(self._suffix) and not ev.name.startswith("."))
                   for ev in events):
            return
        # One save is often several events (write, rename): act once they settle.
        if self._pending is not None:
            self._pending.cancel()
        self._pending = asyncio.get_running_loop().call_later(self._settle, self._fire)

    def _fire(self) -> None:
        self._pending = None
        self._on_change()

    def close(self) -> None:
        if self._inotify is not None:
            asyncio.get_running_loop().remove_reader(self._inotify)
            os.close(self._inotify)
            self._inotify = None
