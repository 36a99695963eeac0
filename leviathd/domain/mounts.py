"""A `mounts` entry of a config or blueprint: a host path shown to the agent,
read-only or writable. The config reads it (leviathd/config/models.py), the
merge narrows it, the fence turns it into mount steps (leviathd/sandbox/spec.py)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict


class Access(StrEnum):
    READ = "read"
    WRITE = "write"

    @property
    def rank(self) -> int:
        return 0 if self is Access.READ else 1


def _home_or_absolute(value: str) -> str:
    if not (value.startswith("/") or value.startswith("~/") or value == "~"):
        raise ValueError(f"must be an absolute path or start with ~/, not {value!r}")
    if "\0" in value:
        raise ValueError("contains a NUL byte")
    parts = value.split("/")[1:]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"may not contain '.' or '..' components: {value!r}")
    return value


# An absolute path or one under the user's home (~/...), with no . or ..
MountPath = Annotated[str, AfterValidator(_home_or_absolute)]


class MountRequest(BaseModel):
    """One `mounts` entry as configured (the fence's own mount steps are
    sandbox/spec.Mount)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: MountPath
    access: Access = Access.READ
