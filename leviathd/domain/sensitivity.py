"""Sensitivity labels: Public < Internal < Private.

Labels are assigned by the runtime, from the tool that produced the data
(leviathd/policy/labels.py); nothing an agent sends can choose or change one."""

from __future__ import annotations

from enum import IntEnum
from typing import Annotated

from pydantic import PlainSerializer, PlainValidator

from leviathd.errors import InvalidArgument


class Sensitivity(IntEnum):
    PUBLIC = 0
    INTERNAL = 1
    PRIVATE = 2

    def __str__(self) -> str:
        return self.name.lower()

    @property
    def rank(self) -> int:
        """Public < Internal < Private, as for the other ordered settings."""
        return int(self)

    @classmethod
    def parse(cls, value: object) -> Sensitivity:
        if isinstance(value, Sensitivity):
            return value
        text = str(value).strip().lower()
        for level in cls:
            if level.name.lower() == text:
                return level
        raise InvalidArgument(
            f"unknown sensitivity {value!r}: expected public, internal or private"
        )


def _label(value: object) -> Sensitivity:
    # Exact names only, as config files spell them; an instance passes as is.
    if isinstance(value, Sensitivity):
        return value
    if isinstance(value, str):
        for level in Sensitivity:
            if str(level) == value:
                return level
    raise ValueError(f"must be 'public', 'internal' or 'private', not {value!r}")


# A label in a pydantic model (a config file, a settings snapshot): read and
# written as its name, "public", "internal" or "private".
Label = Annotated[Sensitivity, PlainValidator(_label), PlainSerializer(str, return_type=str)]
