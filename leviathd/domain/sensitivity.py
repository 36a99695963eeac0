"""Sensitivity labels: Public < Internal < Private.

Labels are assigned by the runtime, from the tool that produced the data
(leviathd/policy/labels.py); nothing an agent sends can choose or change one."""

from __future__ import annotations

from enum import IntEnum

from leviathd.errors import InvalidArgument


class Sensitivity(IntEnum):
    PUBLIC = 0
    INTERNAL = 1
    PRIVATE = 2

    def __str__(self) -> str:
        return self.name.lower()

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
