"""Every test under tests/integration/ runs in the test bed: marked `testbed`,
so it is skipped with the reason (or failed under LEVIATH_REQUIRE_TESTBED=1)
where the bed cannot boot. The `testbed` fixture itself is in tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.testbed)
