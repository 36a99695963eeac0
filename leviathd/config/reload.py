"""The one way the daemon reads its machine configuration again, whatever
asked: `systemctl reload` (SIGHUP), the bus's Reload, an edit the config
watch saw, or a rule Policy1 wrote. Each reload is one journal record of one
shape: `LEVIATH_EVENT=reload` or, when the files do not load and the old
configuration stays in force, `reload-failed` at error priority, both with
`LEVIATH_RELOAD_CAUSE` (a `Cause`) and, when a person asked over the bus,
`LEVIATH_BY_UID`."""

from __future__ import annotations

import syslog
from collections.abc import Callable
from enum import StrEnum

from leviathd.errors import LeviathError
from leviathd.events import Event
from leviathd.systemd import journal


class Cause(StrEnum):
    SIGNAL = "signal"  # SIGHUP: `systemctl reload leviathd`
    BUS = "bus"  # Manager1.Reload
    FILE = "file-change"  # the config watch saw config.toml or rules.d change
    POLICY_ADD = "policy-add"  # Policy1.PolicyAdd wrote an [[allowlist]] rule
    RULE_ADD = "rule-add"  # Policy1.RuleAdd wrote a rules.d rule


class Reloads:
    """`load` reads the files and puts them in force, or raises (a
    LeviathError: ConfigError) leaving the old configuration in force."""

    def __init__(self, load: Callable[[], None], path: str) -> None:
        self._load = load
        self._path = path

    def reload(self, cause: Cause, *, by_uid: int | None = None) -> None:
        """Raises what `load` raised, after saying so in the journal."""
        try:
            self._load()
        except LeviathError as exc:
            journal.record(
                f"{self._path} ({cause}) does not load; the old configuration stays in "
                f"force: {exc}",
                priority=syslog.LOG_ERR, LEVIATH_EVENT=Event.RELOAD_FAILED,
                LEVIATH_RELOAD_CAUSE=cause.value, LEVIATH_BY_UID=by_uid,
            )
            raise
        journal.record(
            f"{self._path} ({cause}): configuration reloaded",
            LEVIATH_EVENT=Event.RELOAD, LEVIATH_RELOAD_CAUSE=cause.value, LEVIATH_BY_UID=by_uid,
        )
