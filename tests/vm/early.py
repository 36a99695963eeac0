"""The Debian 13 VM's build, boot and checks, started as soon as pytest has
collected a VM test (tests/vm/conftest.py), in a thread of their own.

Why: under TCG the VM's checks take 25-40 min; run after the rest of the
suite they pushed `.ci/run` past its hour. Started first, they overlap the
integration tests, and the VM tests (which pytest runs last) find them done
or nearly. The thread is a daemon and qemu.STOP kills the guest when the
session ends early, so an interrupted run leaves no QEMU behind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import qemu

_thread: threading.Thread | None = None
_outcome: list[tuple[bool, Any]] = []


def start(fn: Callable[[], Any]) -> None:
    global _thread
    if _thread is not None:
        return

    def body() -> None:
        try:
            _outcome.append((True, fn()))
        except BaseException as exc:  # pytest's skip/fail are BaseExceptions
            _outcome.append((False, exc))

    _thread = threading.Thread(target=body, name="debian13-vm", daemon=True)
    _thread.start()


def started() -> bool:
    return _thread is not None


def result() -> Any:
    """What fn returned, or its exception raised again, here in the test."""
    assert _thread is not None
    _thread.join()
    ok, value = _outcome[0]
    if not ok:
        raise value
    return value


def stop() -> None:
    qemu.STOP.set()
    if _thread is not None:
        _thread.join(timeout=120)
