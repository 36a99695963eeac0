"""A real dbus-daemon on a socket of the test's own, for the unit tests of the
daemon's bus edge (bus/caller.py, bus/fds.py, bus/compat.py): no fake bus."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def bus_address(tmp_path: Path) -> Iterator[str]:
    if shutil.which("dbus-daemon") is None:
        # Skipped only where nobody asked for every test to run (CI sets it).
        if os.environ.get("LEVIATH_REQUIRE_TESTBED", "") not in ("", "0"):
            pytest.fail("dbus-daemon is missing (scripts/setup installs dbus)")
        pytest.skip("no dbus-daemon")
    proc = subprocess.Popen(
        ["dbus-daemon", "--session", "--nofork", "--print-address=1",
         f"--address=unix:path={tmp_path}/bus"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert proc.stdout is not None
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait()
        proc.stdout.close()
