"""Labels of tool output and clearances of outbound tools, from the tool
registry (leviathd/domain/tools.py).

Labels are assigned here, by the runtime, from the tool that produced the
data; nothing an agent sends can choose or change a label.
"""

from __future__ import annotations

from collections.abc import Mapping

from leviathd.domain.sensitivity import Sensitivity
from leviathd.domain.tools import TOOLS, Registry, ToolKind


def is_outbound(tool: str, *, network: bool, tools: Registry = TOOLS) -> bool:
    """Whether a tool can move bytes off the machine. `shell` can only when the
    sandbox has a network."""
    found = tools.get(tool)
    return found is not None and found.can_send_out(network=network)


def clearance_for(
    tool: str, overrides: Mapping[str, object], *, network: bool, tools: Registry = TOOLS
) -> Sensitivity | None:
    """The clearance of an outbound tool (config overrides first), or None for a
    tool that cannot send anything out."""
    found = tools.get(tool)
    if found is None or not found.can_send_out(network=network):
        return None
    if tool in overrides:
        return Sensitivity.parse(overrides[tool])
    return found.clearance


def label_for(tool: str, *, outside_workdir: bool, tools: Registry = TOOLS) -> Sensitivity:
    """The label of a tool's output. A read is Private when it reached
    outside the workdir (through a read-path grant), Internal inside it; the
    broker raises a read's label further for files the agent itself wrote
    while it held more sensitive data (see broker/core.py), so copying
    granted data into the workdir does not launder it."""
    found = tools.get(tool)
    if found is None:
        return Sensitivity.PUBLIC
    if found.kind is ToolKind.READ and outside_workdir:
        return Sensitivity.PRIVATE
    return found.label
