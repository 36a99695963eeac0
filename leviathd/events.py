"""The names the daemon gives its journal records (`LEVIATH_EVENT=`), in one
place: `journalctl LEVIATH_EVENT=...` and the audit readers select by them.
docs/dbus-api.md ("Journal events") lists each; tests/unit/test_events.py
holds the two equal and refuses an event name written as a string literal."""

from __future__ import annotations

from enum import StrEnum


class Event(StrEnum):
    # Agents
    START = "start"  # an agent started (its scope, sandbox kind, user)
    END = "end"  # an agent ended (exit status, or its scope is gone)
    STOP = "stop"  # someone asked an agent to stop
    HOOK_FILES_CHANGED = "hook-files-changed"  # an agent changed hook files it was given
    STEP_START = "step-start"  # a seed command or stage began (the supervisor)
    STEP_END = "step-end"  # ...and ended, with its status
    READS_NOT_GRANTED = "reads-not-granted"  # declared read paths that no config grants
    SANDBOX_FALLBACK = "sandbox-fallback"  # namespace fence unavailable: a container instead
    SANDBOX_UNAVAILABLE = "sandbox-unavailable"  # no fence, run on the host (on_unavailable=warn)
    CONTAINER_START = "container-start"  # the engine started an agent's container (debug)
    # Agent records
    RECORD_BAD = "record-bad"  # a record that cannot be read, moved aside
    RECORD_UNKNOWN = "record-unknown"  # a scope runs without a usable record
    RECORD_UNSAVED = "record-unsaved"  # a record could not be written (kept in memory)
    RECORD_SAVED = "record-saved"  # ...and was written later
    RECONCILE_FAILED = "reconcile-failed"  # systemd could not list the agents' scopes
    # Tools, approvals, policy
    TOOL = "tool"  # one gated tool call and its decision
    TOOL_SUMMARY = "tool-summary"  # calls over the audit budget, counted
    APPROVAL = "approval"  # a person answered a held call
    POLICY_ADD = "policy-add"  # an allowlist rule added to the machine config
    RULE_ADD = "rule-add"  # a policy rule added to /etc/leviath/rules.d (RuleAdd)
    WRITE_WATCH_FAILED = "write-watch-failed"  # files an agent's processes write go unlabelled
    BROKER_LOST = "broker-lost"  # no tool broker for an adopted agent after a restart
    PROXY_LOST = "proxy-lost"  # no network proxy for an adopted agent after a restart
    # The filtered container-engine socket
    ENGINE_ALLOWED = "engine-allowed"  # an engine API request let through
    ENGINE_REFUSED = "engine-refused"  # ...or refused
    ENGINE_SERVICE = "engine-service"  # podman's API service started (or could not be)
    ENGINE_CLEANUP = "engine-cleanup"  # what an agent left in the engine, removed (or not)
    ENGINE_LOST = "engine-lost"  # no engine socket for an adopted agent after a restart
    ENGINE_PLACEMENT = "engine-placement"  # an agent's containers cannot run under its scope
    # The daemon
    READY = "ready"  # serving (agents adopted)
    RELOAD = "reload"  # the machine config was read again
    RELOAD_FAILED = "reload-failed"  # a config that does not load; the last good one stays
    NO_SYSTEMD = "no-systemd"  # systemd is not PID 1: containers only
    BUS_LOST = "bus-lost"  # the system bus connection is gone: exiting for a restart
