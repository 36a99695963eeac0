"""Reading the journal for something that was just written, without racing
journald.

An entry a process wrote (the daemon's records, an agent's output) reaches
the journal through journald's sockets, which it reads when it gets to
them: on a loaded machine a `journalctl` run right after the action may not
have it yet. So a test that expects an entry waits for it, with a bound,
instead of reading once."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from testbed import Testbed

BOUND = 30.0


def journal_until(bed: Testbed, args: Sequence[str], until: Callable[[str], bool], *,
                  user: str | None = None, timeout: float = BOUND) -> str:
    """`journalctl --no-pager -q ARGS`'s output once `until` holds of it, or
    the last one read when the bound is over (the caller's assertion then
    shows what was there)."""
    deadline = time.monotonic() + timeout
    while True:
        out = bed.run(["journalctl", "--no-pager", "-q", *args], user=user,
                      check=False).stdout
        if until(out) or time.monotonic() > deadline:
            return out
        time.sleep(0.3)


def journal_with(bed: Testbed, args: Sequence[str], *needles: str,
                 user: str | None = None, timeout: float = BOUND) -> str:
    """journal_until: once every one of `needles` is in the output."""
    return journal_until(bed, args, lambda out: all(n in out for n in needles),
                         user=user, timeout=timeout)


def config_written(bed: Testbed, path: str, text: str, *, loads: bool = True,
                   timeout: float = 60.0) -> None:
    """Write a file the daemon watches (the machine config, a rules.d file)
    and wait, with a bound, for its record of having read it again: a
    `reload` record, or `reload-failed` for a file that does not load
    (`loads=False`). A fixed sleep after the write raced the watch on a
    loaded machine (the next agent then started with the old settings)."""
    since = bed.run(["date", "+@%s.%N"]).stdout.strip()
    bed.write_file(path, text)
    config_read_since(bed, since, loads=loads, timeout=timeout)


def config_read_since(bed: Testbed, since: str, *, loads: bool = True,
                      timeout: float = 60.0) -> None:
    """Wait, with a bound, for the daemon's record of a config read after
    `since` (`date +@%s.%N` in the bed); fail with its journal if none came."""
    event = "reload" if loads else "reload-failed"
    out = journal_until(bed, ["-u", "leviathd", "-o", "cat", "--since", since,
                              f"LEVIATH_EVENT={event}"], lambda out: bool(out.strip()),
                        timeout=timeout)
    assert out.strip(), ("the daemon did not read its config again",
                         bed.journal("leviathd.service", lines=30))
