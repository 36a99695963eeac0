"""What a start runs and in which sandbox (agents/service.py): the request
prepared (the user, the configuration merged with the blueprint, the plan of
steps and their sandbox kinds) and each step's spec built, in worker threads,
one request per uid at a time."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import posixpath
import syslog
from collections.abc import Callable
from typing import TypeVar

from leviathd import safetext
from leviathd.agents import admission
from leviathd.agents import feature as feature_calls
from leviathd.agents.base import _UNPROBED, MAX_WAITING_PER_UID, NAMESPACE_STAND_IN
from leviathd.agents.ending import Ending
from leviathd.agents.request import RunInput
from leviathd.config import load as config_load
from leviathd.config.merge import Effective, MergeResult, resolve
from leviathd.config.models import Blueprint
from leviathd.domain.sandbox import SandboxKind
from leviathd.errors import Busy, InvalidArgument, Unavailable
from leviathd.events import Event
from leviathd.identity import UserInfo, user_info
from leviathd.sandbox import claudestate, launchers, toolstate
from leviathd.sandbox.spec import (
    DEFAULT_SCRATCH_DIR,
    RunRequest,
    SandboxSpec,
    build_spec_on_host,
    hidden_paths,
    host_other_homes,
    is_within,
)
from leviathd.systemd import journal

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class _Prepared:
    user: UserInfo
    merged: MergeResult
    command: list[str]
    agent_name: str
    plan: list[tuple[str, Effective, list[str]]]
    kinds: list[SandboxKind]
    marks: list[str]
    # Other accounts' homes (the fence hides them): read here, before the
    # scope's job, because with nss-systemd listing the accounts asks PID 1,
    # which during the job answers late (issue 18).
    other_homes: list[str]


class Planning(Ending):
    """The planning of a start, off the event loop."""

    # --- planning, off the event loop ------------------------------------

    async def _in_worker(self, uid: int, fn: Callable[..., _T], *args: object) -> _T:
        """Run `fn` in the planning pool, one call per uid at a time and at
        most MAX_WAITING_PER_UID waiting: a caller's slow request (a large
        blueprint, a slow engine) delays only that caller's next ones."""
        waiting = self._plan_waiting.get(uid, 0)
        if waiting >= MAX_WAITING_PER_UID:
            raise Busy(f"uid {uid} has {waiting} requests being prepared; try again later")
        self._plan_waiting[uid] = waiting + 1
        try:
            lock = self._plan_locks.setdefault(uid, asyncio.Lock())
            async with lock:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self._plan_pool, lambda: fn(*args))
        finally:
            left = self._plan_waiting[uid] - 1
            if left:
                self._plan_waiting[uid] = left
            else:
                del self._plan_waiting[uid]
                self._plan_locks.pop(uid, None)

    def _prepare(
        self, uid: int, req: RunInput, authorized: Callable[[], None] = lambda: None
    ) -> _Prepared:
        """Who, what and in which sandbox kinds: name lookups, the user's
        config file, the blueprint's parsing and merge, and the engine's and
        image's checks (blocking, in a worker). `authorized` returns once
        polkit said yes (raises otherwise): asked before an engine probe or
        a warning in the journal, which a refused caller must not cause."""
        user = user_info(uid)
        blueprint: Blueprint | None = None
        if req.blueprint_text is not None:
            blueprint = config_load.parse_blueprint(req.blueprint_text, req.blueprint_source)
        command = list(req.command) or list(blueprint.agent.command or [] if blueprint else [])
        # argv[0] is the user's to choose, newlines and all: it becomes a name
        # by the blueprint rules before systemd or journald sees any of it.
        agent_name = (
            safetext.check_name(blueprint.agent.name) if blueprint
            else safetext.agent_name(command[0] if command else "")
        )
        merged = resolve(self.machine_config, self.user_config(user), blueprint, agent_name)
        errors = [f for f in merged.findings if f.level == "error"]
        if errors:
            raise InvalidArgument("; ".join(f"[{f.code}] {f.message}" for f in errors))
        plan = _plan(merged, command, agent_name)
        if not plan:
            raise InvalidArgument("nothing to run: the blueprint has no [agent] command, no "
                                  "stages, and no command was given")
        kinds: list[SandboxKind] = []
        marks: list[str] = []
        # One engine and image check per distinct (engine, image), not per step.
        probes: dict[tuple[str, str], str | None] = {}

        def probe(step_eff: Effective) -> str | None:
            key = (str(step_eff.engine), str(step_eff.image))
            if key not in probes:
                authorized()
                probes[key] = launchers.launcher(SandboxKind.CONTAINER).probe(step_eff)
            return probes[key]

        for _label, step_eff, _argv in plan:
            kind, step_marks = self._choose_kind(step_eff, req, probe, authorized)
            kinds.append(kind)
            # `lev ps` shows a network other than the host's (net:proxy is the
            # default since issue 30).
            if kind == SandboxKind.NAMESPACE and step_eff.network == "proxy":
                step_marks = [*step_marks, "net:proxy"]
            elif kind != SandboxKind.NONE and step_eff.network is not True:
                step_marks = [*step_marks, "net:none"]
            marks += [m for m in step_marks if m not in marks]
        # Before the start is accepted: what would make its agent end at once
        # (agents/admission.py). The starts under way include this one.
        admission.check_keys(user.name, admission.key_use(uid), self._starting.get(uid, 1))
        if any(kind != SandboxKind.NONE and eff.containers.enabled
               and not eff.containers.host_root
               for (_l, eff, _a), kind in zip(plan, kinds, strict=True)):
            admission.check_rootless_engine(user)
        other_homes = host_other_homes(user)
        return _Prepared(user, merged, command, agent_name, plan, kinds, marks, other_homes)

    def _specs(
        self, plan: list[tuple[str, Effective, list[str]]], kinds: list[SandboxKind],
        user: UserInfo,
        req: RunInput, workdir: str, agent_id: str, other_homes: list[str] | None = None,
        authorized: Callable[[], None] = lambda: None,
    ) -> list[tuple[str, SandboxSpec]]:
        self._tool_state(plan, kinds, user, other_homes or [], authorized, agent_id)
        return [
            (label, self._spec(step_eff, kind, user, req, argv, workdir, agent_id, other_homes))
            for (label, step_eff, argv), kind in zip(plan, kinds, strict=True)
        ]

    def _tool_state(
        self, plan: list[tuple[str, Effective, list[str]]], kinds: list[SandboxKind],
        user: UserInfo,
        other_homes: list[str], authorized: Callable[[], None], agent_id: str = "",
    ) -> None:
        """The agent tools' state missing on the host is made, as the user,
        before the specs bind what exists (sandbox/toolstate.py). Only for a
        fence: kind none runs in the real home already."""
        fenced = [(eff, argv) for (_l, eff, argv), kind in zip(plan, kinds, strict=True)
                  if kind != SandboxKind.NONE]
        if not fenced:
            return
        hidden = sorted({h for eff, _argv in fenced for h in hidden_paths(
            user, eff.hidden_paths, scratch_dir=eff.scratch_dir or DEFAULT_SCRATCH_DIR,
            other_homes=other_homes)})
        notes = toolstate.prepare(user.uid, user.gid, user.home,
                                  [argv for _eff, argv in fenced], hidden, authorized)
        if agent_id and not any(is_within(posixpath.join(user.home, claudestate.CONFIG), h)
                                for h in hidden):
            # The fence binds this copy at ~/.claude.json (spec._claude_config);
            # made once polkit allowed the start, as toolstate's entries are.
            note = claudestate.make_copy(user.uid, user.gid, user.home, agent_id, authorized)
            notes += [note] if note else []
        for note in notes:
            journal.record(f"agent tools' state for {user.name}: {note}",
                           priority=syslog.LOG_WARNING)

    def _choose_kind(
        self, eff: Effective, req: RunInput, probe: Callable[[Effective], str | None],
        authorized: Callable[[], None],
    ) -> tuple[SandboxKind, list[str]]:
        if self.podman_only:
            # No systemd to hold a scope: the container is the fence and the
            # limits (see daemon.py and docs/containers.md).
            reason = probe(eff)
            if reason is not None:
                raise Unavailable(f"without systemd, agents run only in containers: {reason}")
            return SandboxKind.CONTAINER, ["no-systemd"]
        if req.sandbox == SandboxKind.NONE:
            return SandboxKind.NONE, ["unsandboxed"]
        kind = SandboxKind(eff.kind)
        if kind == SandboxKind.NONE:
            return SandboxKind.NONE, ["unsandboxed"]
        if kind == SandboxKind.NAMESPACE:
            reason = self.namespace_problem()
            if reason is None:
                return SandboxKind.NAMESPACE, []
            # A container is at least as strict as the fence: use it when it works.
            fallback_problem = probe(eff)
            if fallback_problem is None:
                authorized()
                journal.record(
                    f"the namespace fence cannot be built here ({reason}); falling back to the "
                    "container kind",
                    priority=syslog.LOG_WARNING, LEVIATH_EVENT=Event.SANDBOX_FALLBACK,
                )
                return SandboxKind.CONTAINER, ["fallback:container"]
            reason = f"{reason}; nor can the container fallback: {fallback_problem}"
        else:
            reason = probe(eff)
            if reason is None:
                return SandboxKind.CONTAINER, []
        on_unavailable = str(eff.on_unavailable)
        if on_unavailable == "warn":
            authorized()
            journal.record(
                f"sandbox {kind} unavailable ({reason}); running on the host as configured "
                "(on_unavailable = \"warn\")",
                priority=syslog.LOG_WARNING, LEVIATH_EVENT=Event.SANDBOX_UNAVAILABLE,
            )
            return SandboxKind.NONE, ["unsandboxed", f"{kind}-unavailable"]
        raise Unavailable(f"the {kind} sandbox cannot be built here: {reason}")

    def namespace_problem(self) -> str | None:
        """Why the namespace fence cannot be built here (None: it can). Asked
        once, then again on reload: the answer is the host's, not the run's."""
        if self._namespace_probe is _UNPROBED:
            self._namespace_probe = launchers.launcher(SandboxKind.NAMESPACE).probe(None)
            if self._namespace_probe is None and os.environ.get(NAMESPACE_STAND_IN):
                # A test stand-in: a host whose kernel refuses the fence while
                # podman still works cannot be made on demand in the test bed.
                self._namespace_probe = f"disabled by {NAMESPACE_STAND_IN} (test stand-in)"
        return self._namespace_probe  # type: ignore[return-value]

    def _spec(
        self, eff: Effective, kind: SandboxKind, user: UserInfo, req: RunInput, command: list[str],
        workdir: str, agent_id: str, other_homes: list[str] | None = None,
    ) -> SandboxSpec:
        request = RunRequest(
            argv=tuple(command), workdir=workdir,
            workdir_mode=req.workdir_mode,  # type: ignore[arg-type]  # checked in from_variants
            env=dict(req.env),
        )
        eff = dataclasses.replace(eff, kind=kind)
        spec = build_spec_on_host(eff, user, request, agent_id, other_homes)
        return feature_calls.extend(self.features, spec, eff)


def _plan(
    merged: MergeResult, command: list[str], agent_name: str
) -> list[tuple[str, Effective, list[str]]]:
    """What the agent runs, in order: the blueprint's seed commands, then its
    stages (each with its own effective settings) or its command. A command
    given with the request replaces the stages and the blueprint's command."""
    eff = merged.agent
    plan = [(f"seed {i + 1}", eff, list(argv)) for i, argv in enumerate(merged.seed)]
    if command:
        plan.append((agent_name, eff, command))
    elif merged.stages:
        plan += [(f"stage {name}", st, list(st.command)) for name, st in merged.stages.items()]
    return plan
