"""The test bed: a real systemd, system bus and polkit booted in throwaway
namespaces for integration tests (docs/testbed.md)."""

from .boot import (
    STANDARD_USERS,
    CommandFailed,
    Testbed,
    TestbedError,
    TestbedUnavailable,
    User,
    booted,
    check_host,
)

__all__ = [
    "STANDARD_USERS",
    "CommandFailed",
    "Testbed",
    "TestbedError",
    "TestbedUnavailable",
    "User",
    "booted",
    "check_host",
]
