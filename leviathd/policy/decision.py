"""The decision on a tool call, the pure heart of the tool gate: one function
from a tool call and the agent's state to a decision, following the spec's
order: policy rules (a deny) → permission → reads outside the workdir →
rules (an ask) → taint against clearance (where a machine rule's allow counts
like an allowlist entry) → run. No I/O: paths arrive already normalised; the
broker (broker/core.py, run per agent by the gate service in gate/) re-checks
the real path of every opened file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from leviathd.domain.sensitivity import Sensitivity
from leviathd.domain.tools import TOOLS, ToolKind
from leviathd.policy.labels import label_for
from leviathd.policy.permissions import permission_for
from leviathd.policy.rules import (
    MAX_CALL_STEPS,
    RANK,
    CompiledRule,
    RuleResult,
    StepBudget,
    environment,
    evaluate,
)
from leviathd.policy.settings import CompiledPolicy
from leviathd.readpatterns import is_inside

Outcome = Literal["allow", "deny", "ask"]
AskKind = Literal["permission", "taint"]


@dataclass(frozen=True)
class Call:
    """What the decision needs to know about a call. `paths` are absolute,
    normalised paths the call reads (read tools) or writes (write tools)."""

    tool: str
    target: str = ""
    paths: tuple[str, ...] = ()
    # What a session approval covers, when narrower than `target`: a web
    # call's host *and port* (the allowlist still matches the host).
    scope: str = ""
    # What the agent wrote (its path(s), its URL), where target and paths
    # are what the call will really touch: the real paths of the files the
    # broker opened, the canonical host (leviathd/hosts.py).
    requested: str = ""
    # The host a call reaches, canonical, and the address it will dial
    # (after resolution; "" when it dials nothing or the address is not
    # known, as for a blueprint tool, which resolves for itself).
    host: str = ""
    address: str = ""

    @property
    def approval_key(self) -> str:
        return self.scope or self.target


@dataclass(frozen=True)
class Step:
    check: str
    result: str
    detail: str


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    rule: str
    steps: tuple[Step, ...]
    call: Call
    taint: Sensitivity
    clearance: Sensitivity | None
    label: Sensitivity  # the label the tool's output will carry
    ask_kind: AskKind | None = None


@dataclass(frozen=True)
class Facts:
    """What policy rules see besides the call and the taint: the call's
    arguments, the agent (a map: id, blueprint, stage, user, uid, groups,
    sandbox, network) and its ledger's (tool, target, label) entries."""

    args: Mapping[str, Any] = field(default_factory=dict)
    agent: Mapping[str, Any] = field(default_factory=dict)
    ledger: tuple[tuple[str, str, str], ...] = ()
    now: float | None = None


NO_FACTS = Facts()


class ApprovalView(Protocol):
    def permission_approved(self, tool: str) -> bool: ...

    def taint_approved(self, tool: str, target: str, taint: Sensitivity) -> bool: ...


class NoApprovals:
    def permission_approved(self, tool: str) -> bool:
        return False

    def taint_approved(self, tool: str, target: str, taint: Sensitivity) -> bool:
        return False


NO_APPROVALS = NoApprovals()


# What a call does, for rules (`call.kind`): one rule covers every tool that
# reads a file, whichever of them the agent picked.
RULE_KINDS = {
    ToolKind.READ: "read", ToolKind.WRITE: "write", ToolKind.WEB: "net",
    ToolKind.SHELL: "shell", ToolKind.CREDENTIAL: "credential", ToolKind.GIT: "git",
    ToolKind.SSH: "ssh", ToolKind.BLUEPRINT: "tool",
}


def rule_kind(kind: ToolKind | None) -> str:
    return RULE_KINDS.get(kind, "") if kind is not None else ""


def normalise(path: str, workdir: str) -> str:
    """Lexical absolute form (relative paths are relative to the workdir)."""
    return os.path.normpath(os.path.join(workdir, path))


def rule_views(
    policy: CompiledPolicy, call: Call, taint: Sensitivity, facts: Facts,
) -> list[dict[str, Any]]:
    """What the rules see of this call, once per thing it touches: a call on
    several files (read_files) is judged file by file, each as the target,
    so a rule about one file holds whichever tool reads it; a blueprint
    tool by its command line, then each argument it declares a path, as a
    read."""
    kind = policy.registry.kind_of(call.tool)
    views: list[tuple[str, str]]
    if kind is ToolKind.BLUEPRINT:
        views = [("tool", call.target), *(("read", p) for p in call.paths)]
    elif len(call.paths) > 1:
        views = [(rule_kind(kind), p) for p in call.paths]
    else:
        views = [(rule_kind(kind), call.target)]
    return [environment(tool=call.tool, target=target, args=facts.args, paths=call.paths,
                        taint=str(taint), agent=facts.agent, ledger=facts.ledger,
                        now=facts.now, kind=what, requested=call.requested,
                        host=call.host, address=call.address)
            for what, target in views]


def evaluate_views(
    concern: Sequence[CompiledRule], views: Sequence[Mapping[str, Any]],
) -> RuleResult | None:
    """Every view against the rules, within one call's step budget; the
    strictest result stands (the broker's cooperative form: broker/rulelane.py)."""
    budget = StepBudget(MAX_CALL_STEPS)
    best: RuleResult | None = None
    for env in views:
        found = evaluate(concern, env, budget)
        if found is not None and (best is None or RANK[found.decision] > RANK[best.decision]):
            best = found
        if best is not None and best.decision == "deny":
            break
    return best


def decide(
    policy: CompiledPolicy,
    call: Call,
    taint: Sensitivity,
    approvals: ApprovalView = NO_APPROVALS,
    facts: Facts = NO_FACTS,
    ruled_already: tuple[RuleResult | None] | None = None,
) -> Decision:
    """`ruled_already`: the rules' result, when the caller evaluated them
    itself (the broker does, off the shared path: broker/rulelane.py)."""
    steps: list[Step] = []
    tool = call.tool
    kind = TOOLS.kind_of(tool)
    outside = kind is ToolKind.READ and any(not is_inside(p, policy.workdir) for p in call.paths)
    # For reads this is the label the requested paths predict; the broker
    # settles it on the real paths of the files actually opened.
    own = policy.tools.get(tool)
    # A blueprint tool's is its declared label; the broker raises it to what
    # the shell would get, since the tool runs in the same fence.
    label = label_for(tool, outside_workdir=outside, tools=policy.registry)
    clearance = policy.clearances.get(tool)

    def done(outcome: Outcome, rule: str, kind: AskKind | None = None) -> Decision:
        return Decision(outcome, rule, tuple(steps), call, taint, clearance, label, kind)

    # 1. Permission.
    perm = permission_for(tool, policy.permissions, policy.registry)
    if perm.source == "unknown-tool":
        steps.append(Step("permission", "deny", f"{tool!r} is not a known tool (fail closed)"))
        return done("deny", "unknown-tool")
    # 1a. Policy rules (docs/configuration.md): a deny ends it here; an ask is
    # put after the path checks; an allow counts like an allowlist entry.
    ruled: RuleResult | None = None
    concern = policy.rules.for_tool(tool) if policy.rules else ()
    if concern:
        ruled = (ruled_already[0] if ruled_already is not None
                 else evaluate_views(concern, rule_views(policy, call, taint, facts)))
        if ruled is None:
            steps.append(Step("rules", "none", f"none of {len(concern)} rules for {tool} matched"))
        else:
            steps.append(Step("rules", ruled.decision, f"{ruled.rule}: {ruled.reason}"))
            if ruled.decision == "deny":
                return done("deny", ruled.rule)
    steps.append(Step("permission", perm.permission, f"{tool} = {perm.permission} ({perm.source})"))
    if perm.permission == "deny":
        return done("deny", f"permission:{tool}=deny")
    if perm.permission == "ask":
        if not approvals.permission_approved(tool):
            return done("ask", f"permission:{tool}=ask", "permission")
        steps.append(Step("approval", "allow", f"{tool} approved by a person"))

    # 2. Paths: reads may leave the workdir only through a grant; writes never.
    workdir = policy.workdir
    if kind is ToolKind.READ:
        for path in call.paths:
            if policy.grant.hidden(path):
                steps.append(Step("read-path", "deny", f"{path} is a hidden path"))
                return done("deny", "hidden-path")
            if is_inside(path, workdir):
                steps.append(Step("read-path", "inside", f"{path} is inside the workdir"))
                continue
            grant = policy.grant.match(path)
            if grant is None:
                detail = f"{path} is outside the workdir, not granted"
                steps.append(Step("read-path", "deny", detail))
                return done("deny", "read-path-not-granted")
            steps.append(Step("read-path", "granted", f"{path} granted by {grant!r}"))
    elif kind is ToolKind.WRITE:
        for path in call.paths:
            if not policy.grant.may_write(path):
                steps.append(Step("write-path", "deny", f"{path} is outside the workdir"))
                return done("deny", "write-outside-workdir")
            steps.append(Step("write-path", "inside", f"{path} is inside the workdir"))
    elif own is not None:
        steps.append(Step("read-path", "fence", f"{tool} is a blueprint tool: it runs in the "
                          "agent's fence and sees what its shell sees"))
    else:
        steps.append(Step("read-path", "n/a", f"{tool} reads no host paths"))

    if ruled is not None and ruled.decision == "ask":
        if not approvals.taint_approved(tool, call.approval_key, taint):
            return done("ask", ruled.rule, "taint")
        steps.append(Step("approval", "allow", f"{ruled.rule} approved by a person"))

    # 3. Taint against clearance, for tools that can send data out.
    settings = policy.settings
    if clearance is None:
        steps.append(Step("taint", "n/a", f"{tool} cannot send data off the machine"))
        return done("allow", "not-outbound")
    if not settings.taint_enabled:
        steps.append(Step("taint", "off", "taint tracking is disabled"))
        return done("allow", "taint-disabled")
    if taint <= clearance:
        steps.append(Step("taint", "ok", f"taint {taint} ≤ clearance {clearance} of {tool}"))
        return done("allow", "within-clearance")
    steps.append(Step("taint", "exceeds", f"taint {taint} > clearance {clearance} of {tool}"))
    rule = policy.allowlist.find(tool, call.target, taint)
    if rule is not None:
        steps.append(Step("allowlist", "allow", rule.describe()))
        return done("allow", f"allowlist#{rule.index}")
    steps.append(Step("allowlist", "none", f"no allowlist rule covers {tool} → {call.target!r}"))
    if ruled is not None and ruled.decision == "allow":
        steps.append(Step("rules", "allow", f"{ruled.rule} allows it above clearance"))
        return done("allow", ruled.rule)
    if approvals.taint_approved(tool, call.approval_key, taint):
        steps.append(Step("approval", "allow", "approved by a person for this session"))
        return done("allow", "session-approval")
    steps.append(Step("on_exceed", settings.on_exceed, f"[taint] on_exceed = {settings.on_exceed}"))
    if settings.on_exceed == "allow":
        return done("allow", "on_exceed=allow")
    if settings.on_exceed == "deny":
        return done("deny", "on_exceed=deny")
    return done("ask", "on_exceed=ask", "taint")
