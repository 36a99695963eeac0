"""The kind of fence an agent runs in. A str-valued enum, so configs, records
and the bus keep their spelling ("none", "namespace", "container"); the
config reads it (leviathd/config/models.py), the sandbox types
`SandboxSpec.kind` with it (leviathd/sandbox/spec.py) and picks the kind's
launcher by it (leviathd/sandbox/launchers.py)."""

from __future__ import annotations

from enum import StrEnum


class SandboxKind(StrEnum):
    NONE = "none"
    NAMESPACE = "namespace"
    CONTAINER = "container"

    @property
    def rank(self) -> int:
        """none < namespace < container: a higher rank fences more."""
        return _KIND_RANK[self]


_KIND_RANK = {SandboxKind.NONE: 0, SandboxKind.NAMESPACE: 1, SandboxKind.CONTAINER: 2}
