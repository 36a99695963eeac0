"""Per-tool permission: allow, ask or deny. Unknown tools fail closed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from leviathd.domain.permission import Permission
from leviathd.domain.tools import TOOLS, Registry


def parse_permission(value: object) -> Permission:
    text = str(value).strip().lower()
    if text == "allow":
        return Permission.ALLOW
    if text == "ask":
        return Permission.ASK
    # Anything unexpected is a deny (fail closed), including "deny".
    return Permission.DENY


@dataclass(frozen=True)
class PermissionResult:
    permission: Permission
    source: str  # "config", "default" or "unknown-tool"


def compile_permissions(
    configured: Mapping[str, object], tools: Registry = TOOLS
) -> dict[str, Permission]:
    return {tools.canonical(tool): parse_permission(level) for tool, level in configured.items()}


def permission_for(
    tool: str, table: Mapping[str, Permission], tools: Registry = TOOLS
) -> PermissionResult:
    found = tools.find(tool)
    if found is None:
        return PermissionResult(Permission.DENY, "unknown-tool")
    if found.name in table:
        return PermissionResult(table[found.name], "config")
    return PermissionResult(found.permission, "default")
