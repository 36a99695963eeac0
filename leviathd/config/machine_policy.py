"""Policy1's side of the machine configuration: add an `[[allowlist]]` rule
to /etc/leviath/config.toml or a policy rule to rules.d, each checked with
the files it joins before it replaces one atomically, then reloaded and
recorded in the journal; and the allowlist in force, for those it applies
to. The bus edge only translates: it checked `org.leviath.config.manage`
before the writes (their `needs`); reading the list asks through the call's
Authority."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from leviathd.authority import Call, Right
from leviathd.config.edit import add_machine_rule, append_rule, machine_write_target
from leviathd.config.models import Config
from leviathd.config.reload import Cause, Reloads
from leviathd.domain.allowrule import AllowRule
from leviathd.domain.sensitivity import Sensitivity
from leviathd.domain.tools import checked_tool_name
from leviathd.errors import InvalidArgument
from leviathd.events import Event
from leviathd.systemd import journal

DECISIONS = ("allow", "deny", "ask")


class MachinePolicy:
    def __init__(self, path: Path, in_force: Callable[[], Config], reloads: Reloads) -> None:
        self._path = path
        self._in_force = in_force
        self._reloads = reloads
        # Two writers must not lose each other's rule.
        self._lock = asyncio.Lock()

    async def add_allow(self, call: Call, tool: str, target: str, max_sensitivity: str) -> Path:
        """The file written (the link's target when config.toml is a link)."""
        level = Sensitivity.parse(max_sensitivity)
        if not target or "\0" in target or "\n" in target:
            raise InvalidArgument("target must be a non-empty single-line glob")
        tool = checked_tool_name(tool)  # any tool may be named; unknown ones fail closed
        async with self._lock:
            real = await asyncio.to_thread(machine_write_target, self._path)
            try:
                await asyncio.to_thread(append_rule, real, tool, target, level)
            except OSError as exc:
                raise InvalidArgument(f"cannot write {real}: {exc.strerror}") from None
            self._reloads.reload(Cause.POLICY_ADD, by_uid=call.who.uid)
        journal.record(
            f"allowlist rule added to {real} by uid {call.who.uid}: {tool} {target!r} "
            f"up to {level}",
            LEVIATH_EVENT=Event.POLICY_ADD, LEVIATH_BY_UID=call.who.uid, LEVIATH_TOOL=tool,
            LEVIATH_TARGET=target,
        )
        return real

    async def add_rule(self, call: Call, name: str, when: str, decision: str,
                       reason: str) -> Path:
        """The rules.d file written."""
        if decision not in DECISIONS:
            raise InvalidArgument("decision must be allow, deny or ask")
        async with self._lock:
            try:
                where = await asyncio.to_thread(add_machine_rule, self._path, name, when,
                                                decision, reason)
            except OSError as exc:
                raise InvalidArgument(f"cannot write the rule: {exc.strerror}") from None
            self._reloads.reload(Cause.RULE_ADD, by_uid=call.who.uid)
        journal.record(
            f"policy rule {name!r} ({decision}) added to {where} by uid {call.who.uid}",
            LEVIATH_EVENT=Event.RULE_ADD, LEVIATH_BY_UID=call.who.uid,
            LEVIATH_RULE=f"rule:machine:{name}",
        )
        return where

    async def allowlist(self, call: Call) -> list[AllowRule]:
        """The machine allowlist in force. The file may be 0600: the rules are
        for whoever they apply to, that is admins and people who may run
        agents (every rule applies to every agent), and nobody else."""
        if not await call.authority.allowed(call.who, Right.CONFIG_MANAGE):
            await call.authority.require(call.who, Right.RUN, "read the tool policy")
        return list(self._in_force().allowlist)
