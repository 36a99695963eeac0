"""A tool's permission: allow, ask or deny (strictness in that order)."""

from __future__ import annotations

from enum import StrEnum


class Permission(StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"

    @property
    def rank(self) -> int:
        """Strictness: allow < ask < deny."""
        return _PERMISSION_RANK[self]


_PERMISSION_RANK = {Permission.ALLOW: 0, Permission.ASK: 1, Permission.DENY: 2}
