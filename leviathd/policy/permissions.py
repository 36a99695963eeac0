"""Per-tool permission: allow, ask or deny. Unknown tools fail closed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

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


def is_known_tool(name: str) -> bool:
    return name in _KNOWN


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
    return {tool: parse_permission(level) for tool, level in configured.items()}


def permission_for(tool: str, table: Mapping[str, Permission]) -> PermissionResult:
    if tool not in _KNOWN:
        return PermissionResult("deny", "unknown-tool")
    if tool in table:
        return PermissionResult(table[tool], "config")
    return PermissionResult(DEFAULT_PERMISSION, "default")
