"""The one error of the filtered engine socket's rules: the reason, for the
agent (the proxy prefixes `leviathd:`), and the HTTP status it is sent with."""

from __future__ import annotations


class Refused(Exception):
    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
