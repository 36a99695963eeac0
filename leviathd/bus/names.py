"""Every bus name, object path, interface and polkit action in one place."""

from __future__ import annotations

BUS_NAME = "org.leviath.Manager1"
OBJECT_PATH = "/org/leviath/Manager1"
MANAGER_IFACE = "org.leviath.Manager1"
POLICY_IFACE = "org.leviath.Policy1"

ACTION_RUN = "org.leviath.agent.run"
ACTION_RUN_UNSANDBOXED = "org.leviath.agent.run-unsandboxed"
ACTION_MANAGE_ANY = "org.leviath.agent.manage-any"
ACTION_CONFIG_MANAGE = "org.leviath.config.manage"
ACTION_ANSWER_ANY = "org.leviath.approval.answer-any"
