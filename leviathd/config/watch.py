"""Re-read the machine configuration when its file changes (inotify), so the
next `lev run` after an edit uses it without a restart. The folder is watched,
not the file: editors and `lev policy` replace files by renaming."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

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
        self._inotify: Any = None
        self._pending: asyncio.TimerHandle | None = None

    def start(self) -> None:
        folder = os.path.dirname(self._path) or "."
        try:
            # Not packaged by Debian: where it is missing, SIGHUP and Reload
            # still re-read the file.
            from inotify_simple import INotify, flags
        except ImportError:
            log.warning("inotify_simple is not installed: edits to %s take effect on "
                        "`systemctl reload leviathd`", self._path)
            return
        mask = flags.CLOSE_WRITE | flags.MOVED_TO | flags.CREATE | flags.DELETE | flags.MOVED_FROM
        try:
            os.makedirs(folder, mode=0o755, exist_ok=True)
            inotify = INotify()
            inotify.add_watch(folder, mask)
        except OSError as exc:
            log.warning("not watching %s for changes (%s); use `systemctl reload leviathd`",
                        self._path, exc)
            return
        self._inotify = inotify
        asyncio.get_running_loop().add_reader(inotify.fileno(), self._readable)

    def _readable(self) -> None:
        assert self._inotify is not None
        events = self._inotify.read(timeout=0)
        if not any(ev.name == self._name if not self._suffix
                   else ev.name.endswith(self._suffix) and not ev.name.startswith(".")
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
            asyncio.get_running_loop().remove_reader(self._inotify.fileno())
            self._inotify.close()
            self._inotify = None
