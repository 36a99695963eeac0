"""sd_notify through libsystemd (pystemd): READY only once the bus name is ours."""

from __future__ import annotations

import pystemd.daemon


def ready(status: str) -> None:
    pystemd.daemon.notify(False, "READY=1", f"STATUS={status}")


def reloading() -> None:
    pystemd.daemon.notify(False, "RELOADING=1")


def stopping() -> None:
    pystemd.daemon.notify(False, "STOPPING=1")
