"""Shared pytest setup: the session-wide `testbed` fixture (a real systemd,
system bus and polkit booted in throwaway namespaces, see tests/testbed/).

A test that needs it takes the `testbed` fixture, and is marked
`pytest.mark.testbed` automatically. Where the host cannot boot the bed (not
root, no namespaces) such tests are skipped with the reason; with
LEVIATH_REQUIRE_TESTBED=1 (set by CI) that skip is a failure instead.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

REPO = Path(__file__).resolve().parent.parent
# The tests import the checkout (not an installed copy) and the testbed package.
for entry in (str(REPO / "tests"), str(REPO)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from testbed import Testbed, TestbedUnavailable, check_host  # noqa: E402

REQUIRE_ENV = "LEVIATH_REQUIRE_TESTBED"

# CI runs the property tests with a fixed seed, so a red run can be replayed;
# elsewhere they explore anew each time.
try:
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("ci", derandomize=True, deadline=None)
    if os.environ.get("CI"):
        _hypothesis_settings.load_profile("ci")
except ImportError:  # pragma: no cover - hypothesis is a test dependency
    pass


def testbed_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def testbed_unavailable(reason: str) -> None:
    """Skip (or, when required, fail) the current test: the bed cannot boot here."""
    if testbed_required():
        pytest.fail(f"{REQUIRE_ENV} is set but the test bed cannot boot: {reason}", pytrace=False)
    pytest.skip(f"test bed unavailable: {reason}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "testbed" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.testbed)


def pytest_runtest_setup(item: pytest.Item) -> None:
    # A test marked `testbed` needs root and namespaces even where it does not
    # take the fixture itself: give it the same skip-or-fail decision.
    if item.get_closest_marker("testbed") is not None:
        try:
            check_host()
        except TestbedUnavailable as e:
            testbed_unavailable(str(e))


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """A booted test bed with the checkout installed and the standard users.

    Users: alice and bob in group leviath, carol in no group, dave in leviath
    and leviath-admin. leviathd.service is installed (and enabled) when units/
    has it, but not started: tests start it with testbed.start_service().
    """
    try:
        check_host()
    except TestbedUnavailable as e:
        testbed_unavailable(str(e))
    # SIGTERM (CI timeouts) would kill pytest without teardown; make it unwind
    # like Ctrl-C so the bed is powered off and its cgroups removed.
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_interrupt)
    bed = Testbed()
    try:
        bed.start()
        bed.wait_running()
        bed.install_project(REPO)
        bed.add_standard_users()
        yield bed
    finally:
        bed.stop()
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, previous)
