"""Errors a person reads. Every layer raises these; the CLI prints one line and
the bus layer maps `dbus_name` to a named D-Bus error."""

from __future__ import annotations


class LeviathError(Exception):
    dbus_name = "org.leviath.Error.Failed"
    exit_code = 1


class InvalidArgument(LeviathError):
    dbus_name = "org.leviath.Error.InvalidArgument"


class ConfigError(InvalidArgument):
    """A config or blueprint file is wrong; the message names file, line and key."""

    dbus_name = "org.leviath.Error.InvalidConfig"


class NotFound(LeviathError):
    dbus_name = "org.leviath.Error.NotFound"


class AccessDenied(LeviathError):
    dbus_name = "org.leviath.Error.AccessDenied"


class Unavailable(LeviathError):
    """The sandbox (or another part) cannot be built on this host."""

    dbus_name = "org.leviath.Error.SandboxUnavailable"


class LimitExceeded(InvalidArgument):
    """A request went over one of the broker's configured limits (`[broker]`):
    refused by name, with the limit, never by dropping the connection. (It
    answers agents on their broker socket; on the bus it would be an
    InvalidArgument.)"""

    def __init__(self, limit: str, value: int, message: str) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value


class Busy(LeviathError):
    """A caller has too many requests in progress; others are not held up."""

    dbus_name = "org.leviath.Error.Busy"


class NoSpace(LeviathError):
    """The state folder's filesystem is full (or over quota): said by name,
    so that an admin knows what to free, not hidden as an internal error."""

    dbus_name = "org.leviath.Error.NoSpace"

    def __init__(self, where: str, detail: str = "") -> None:
        super().__init__(
            f"no space left in {where}" + (f" ({detail})" if detail else "")
            + "; free some space there, then try again"
        )
        self.where = where
