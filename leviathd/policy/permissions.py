"""Per-tool permission: allow, ask or deny. Unknown tools fail closed."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from leviathd.errors import InvalidArgument
from leviathd.policy.labels import CREDENTIAL_TOOL, READ_TOOLS, SHELL_TOOL, WEB_TOOLS, WRITE_TOOLS

Permission = Literal["allow", "ask", "deny"]
PERMISSIONS: tuple[Permission, ...] = ("allow", "ask", "deny")

# Every tool the broker implements; the config validator warns on other names.
KNOWN_TOOLS: tuple[str, ...] = tuple(
    sorted(READ_TOOLS | WRITE_TOOLS | WEB_TOOLS | {SHELL_TOOL, CREDENTIAL_TOOL})
)
_KNOWN = frozenset(KNOWN_TOOLS)

# A known tool nobody configured is allowed: permissions tighten, and the
# read-path and taint checks still apply after this one.
DEFAULT_PERMISSION: Permission = "allow"


# Other names for a built-in tool: the seeds call the shell tool "bash".
TOOL_ALIASES: Mapping[str, str] = {"bash": SHELL_TOOL}
# Policy may name any tool (an MCP server's, a blueprint's), not only the
# built-in ones; a name is one token, so that it reads the same everywhere.
_TOOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,127}")


def canonical_tool(name: str) -> str:
    return TOOL_ALIASES.get(name, name)


def checked_tool_name(name: str) -> str:
    """`name` as policy stores it (aliases resolved), or InvalidArgument."""
    if not _TOOL_NAME.fullmatch(name):
        raise InvalidArgument(
            f"tool name {name[:64]!r} is not valid: a letter, then letters, digits, "
            "'_', '.', ':' or '-' (at most 128)"
        )
    return canonical_tool(name)


def is_known_tool(name: str) -> bool:
    return canonical_tool(name) in _KNOWN


def parse_permission(value: object) -> Permission:
    text = str(getattr(value, "value", value)).strip().lower()
    if text == "allow":
        return "allow"
    if text == "ask":
        return "ask"
    # Anything unexpected is a deny (fail closed), including "deny".
    return "deny"


@dataclass(frozen=True)
class PermissionResult:
    permission: Permission
    source: str  # "config", "default" or "unknown-tool"


def compile_permissions(configured: Mapping[str, object]) -> dict[str, Permission]:
    return {canonical_tool(tool): parse_permission(level) for tool, level in configured.items()}


def permission_for(tool: str, table: Mapping[str, Permission]) -> PermissionResult:
    tool = canonical_tool(tool)
    if tool not in _KNOWN:
        return PermissionResult("deny", "unknown-tool")
    if tool in table:
        return PermissionResult(table[tool], "config")
    return PermissionResult(DEFAULT_PERMISSION, "default")
