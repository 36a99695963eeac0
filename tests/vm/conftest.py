"""Starts the Debian 13 VM early (early.py): once collection is done, if any
selected test is a VM test, so that its half hour under TCG runs beside the
rest of the suite rather than after it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import early  # noqa: E402


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    for item in session.items:
        module = getattr(item, "module", None)
        if module is not None and Path(str(item.path)).resolve().parent == HERE:
            early.start(module.bring_up)
            return


def pytest_sessionfinish(session: pytest.Session) -> None:
    early.stop()
