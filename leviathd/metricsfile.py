"""The metrics file (`[metrics] file`, issue 46): the OpenMetrics text of
metrics.py written every `interval` seconds, atomically (a temporary file
renamed over the old one), where node exporter's textfile collector reads
it; Debian's prometheus-node-exporter looks in /var/lib/prometheus/node-exporter.

Root writes only into a folder that is root's alone (owner root, no group or
other write), opened by descriptor (fsat.py): a folder someone else can write
is refused, said once in the journal. A missing folder (node exporter not
installed) is not made: nothing is written, said once. The figures are
gathered on the loop (a copy of the counters and the running agents' user
and kind, no I/O); the rest (the daemon's descriptors and memory, the text,
the write and its fsyncs) runs in a thread."""

from __future__ import annotations

import asyncio
import grp
import logging
import os
import stat
import syslog
from collections.abc import Callable

from leviathd import fsat, metrics
from leviathd.systemd import journal

DEFAULT_FILE = "/var/lib/prometheus/node-exporter/leviathd.prom"
DEFAULT_INTERVAL = 30
# node exporter runs as this user on Debian: the file is its group's to read,
# not every local user's (it names users and credentials).
READER_GROUP = "prometheus"

log = logging.getLogger(__name__)


class MetricsFolderRefused(OSError):
    """The folder is not root's alone: root writes nothing there."""


def write(path: str, families: list[metrics.Family]) -> None:
    """Render and replace `path` (blocking: a thread)."""
    text = metrics.render([*families, *metrics.process_families()])
    folder, name = os.path.split(path)
    dfd = fsat.open_dir(folder)
    try:
        st = os.fstat(dfd)
        if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise MetricsFolderRefused(
                f"{folder} is not root's alone (owner uid {st.st_uid}, mode "
                f"{st.st_mode & 0o7777:o}): leviathd writes no metrics there")
        try:
            gid: int | None = grp.getgrnam(READER_GROUP).gr_gid
        except KeyError:
            gid = None
        fsat.atomic_write_at(dfd, name, text.encode(), mode=0o640 if gid is not None else 0o644,
                             uid=0, gid=gid if gid is not None else 0)
    finally:
        os.close(dfd)


class MetricsFile:
    """The periodic writer; `settings` reads ([metrics] file, interval) from
    the machine config in force, so a reload moves or stops it."""

    def __init__(self, gather: Callable[[], list[metrics.Family]],
                 settings: Callable[[], tuple[str, int]]) -> None:
        self._gather = gather
        self._settings = settings
        self._said: str = ""

    def _say_once(self, what: str, priority: int) -> None:
        if what != self._said:
            self._said = what
            journal.record(what, priority=priority)

    async def write_once(self) -> bool:
        """One write now (also the first, at start); False when none was made."""
        path, _interval = self._settings()
        if not path:
            return False
        families = self._gather()
        try:
            await asyncio.to_thread(write, path, families)
        except FileNotFoundError:
            self._say_once(f"metrics: {os.path.dirname(path)} does not exist (node exporter's "
                           "textfile folder: [metrics] file); no metrics file is written",
                           syslog.LOG_INFO)
            return False
        except OSError as exc:
            self._say_once(f"metrics: cannot write {path}: {exc}", syslog.LOG_WARNING)
            return False
        self._said = ""
        return True

    async def run(self) -> None:
        while True:
            try:
                await self.write_once()
            except Exception:  # the daemon never ends over its figures
                log.warning("writing the metrics file failed", exc_info=True)
            await asyncio.sleep(self._settings()[1])
