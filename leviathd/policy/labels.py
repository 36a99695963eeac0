"""Sensitivity labels and tool clearances.

Labels are assigned here, by the runtime, from the tool that produced the
data; nothing an agent sends can choose or change a label.
"""

from __future__ import annotations

from collections.abc import Mapping
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
        text = str(getattr(value, "value", value)).strip().lower()
        for level in cls:
            if level.name.lower() == text:
                return level
        raise InvalidArgument(
            f"unknown sensitivity {value!r}: expected public, internal or private"
        )


READ_TOOLS = frozenset({"read_file", "read_files", "list_dir"})
WRITE_TOOLS = frozenset({"write_file", "edit_file"})
WEB_TOOLS = frozenset({"web_fetch", "http_get", "http_post"})
CREDENTIAL_TOOL = "credential"
SHELL_TOOL = "shell"

# The highest label each outbound tool is trusted with by default. Internal:
# an agent may send what it read in its own workdir (it was given that work),
# but not what came through a read-path grant or a credential.
DEFAULT_CLEARANCE: Mapping[str, Sensitivity] = {
    "web_fetch": Sensitivity.INTERNAL,
    "http_get": Sensitivity.INTERNAL,
    "http_post": Sensitivity.INTERNAL,
    CREDENTIAL_TOOL: Sensitivity.INTERNAL,
    SHELL_TOOL: Sensitivity.INTERNAL,
}


def is_outbound(tool: str, *, network: bool) -> bool:
    """Whether a tool can move bytes off the machine. `shell` can only when the
    sandbox has a network."""
    if tool == SHELL_TOOL:
        return network
    return tool in DEFAULT_CLEARANCE


def clearance_for(
    tool: str, overrides: Mapping[str, object], *, network: bool
) -> Sensitivity | None:
    """The clearance of an outbound tool (config overrides first), or None for a
    tool that cannot send anything out."""
    if not is_outbound(tool, network=network):
        return None
    if tool in overrides:
        return Sensitivity.parse(overrides[tool])
    return DEFAULT_CLEARANCE[tool]


def label_for(tool: str, *, outside_workdir: bool) -> Sensitivity:
    """The label of a tool's output. A read is Private when it reached
    outside the workdir (through a read-path grant), Internal inside it; the
    broker raises a read's label further for files the agent itself wrote
    while it held more sensitive data (see broker/core.py), so copying
    granted data into the workdir does not launder it."""
    if tool in READ_TOOLS:
        return Sensitivity.PRIVATE if outside_workdir else Sensitivity.INTERNAL
    if tool in WEB_TOOLS:
        return Sensitivity.PUBLIC
    if tool == CREDENTIAL_TOOL:
        return Sensitivity.PRIVATE
    if tool == SHELL_TOOL:
        # The shell sees the workdir (and whatever the sandbox mounts).
        return Sensitivity.INTERNAL
    # write_file / edit_file return an acknowledgement, no data.
    return Sensitivity.PUBLIC
