"""The one reload path (leviathd/config/reload.py): whatever asked, a reload
is one journal record of one shape, and a file that does not load keeps the
old configuration, says so at error priority and raises to whoever asked."""

from __future__ import annotations

import syslog
from typing import Any

import pytest

from leviathd.config import reload as reload_mod
from leviathd.config.reload import Cause, Reloads
from leviathd.errors import ConfigError
from leviathd.events import Event

PATH = "/etc/leviath/config.toml"


def _records(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def record(message: str, *, priority: int = syslog.LOG_INFO, **fields: object) -> None:
        seen.append({"MESSAGE": message, "PRIORITY": priority, **fields})

    monkeypatch.setattr(reload_mod.journal, "record", record)
    return seen


def test_every_cause_gives_the_same_record(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _records(monkeypatch)
    loads: list[int] = []
    reloads = Reloads(lambda: loads.append(1), PATH)
    for cause in Cause:
        reloads.reload(cause, by_uid=1000 if cause is Cause.BUS else None)
    assert len(loads) == len(Cause)
    assert [r["LEVIATH_RELOAD_CAUSE"] for r in seen] == [c.value for c in Cause]
    for r in seen:
        assert r["LEVIATH_EVENT"] is Event.RELOAD
        assert r["PRIORITY"] == syslog.LOG_INFO
        assert set(r) == {"MESSAGE", "PRIORITY", "LEVIATH_EVENT", "LEVIATH_RELOAD_CAUSE",
                          "LEVIATH_BY_UID"}
    assert [r["LEVIATH_BY_UID"] for r in seen if r["LEVIATH_RELOAD_CAUSE"] == "bus"] == [1000]


def test_a_file_that_does_not_load_is_said_and_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _records(monkeypatch)

    def broken() -> None:
        raise ConfigError(f"{PATH}:3: not valid TOML")

    with pytest.raises(ConfigError):
        Reloads(broken, PATH).reload(Cause.FILE)
    [r] = seen
    assert r["LEVIATH_EVENT"] is Event.RELOAD_FAILED
    assert r["PRIORITY"] == syslog.LOG_ERR
    assert r["LEVIATH_RELOAD_CAUSE"] == "file-change"
    assert "the old configuration stays in force" in r["MESSAGE"]
    assert f"{PATH}:3: not valid TOML" in r["MESSAGE"]
