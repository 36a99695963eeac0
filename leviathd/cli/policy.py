"""`lev policy list | add | test`: the tool policy as the gate sees it.

`add` edits the user's config.toml by appending an `[[allowlist]]` table
(or, with --rule, a `[[rules]]` table) to the text, so comments and layout
survive; the result is parsed before it replaces the file, and the
replacement is atomic (temporary file, fsync, rename). With --system the
rule goes to the machine's policy through the daemon (`PolicyAdd` to the
machine config, `RuleAdd` to /etc/leviath/rules.d; polkit
org.leviath.config.manage), which writes the file the same way and reloads it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from leviathd.config.edit import append_rule, append_user_rule
from leviathd.config.load import (
    load_blueprint,
    load_configs,
    user_config_path,
)
from leviathd.config.merge import resolve
from leviathd.config.policy_settings import policy_settings
from leviathd.domain.sensitivity import Sensitivity
from leviathd.domain.tools import TOOLS, SendsOut, ToolKind, checked_tool_name
from leviathd.errors import InvalidArgument
from leviathd.policy.decision import Facts, decide
from leviathd.policy.permissions import permission_for
from leviathd.policy.settings import CompiledPolicy, PolicySettings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("policy", help="list, add to and dry-run the tool policy")
    psub = p.add_subparsers(dest="policy_command", metavar="ACTION", required=True)

    ls = psub.add_parser("list", help="permissions, clearances, allowlist and rules in force")
    ls.add_argument("--agent", help="show the tables for this agent name")
    ls.add_argument("--blueprint", help="blueprint folder or file: its rules, permissions and "
                    "own tools ([tools.NAME]) too")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=run_list)

    add = psub.add_parser(
        "add", help="add an [[allowlist]] rule, or a [[rules]] policy rule with --rule",
        description="`lev policy add TOOL --target GLOB --max-sensitivity LEVEL` adds an "
        "[[allowlist]] rule; `lev policy add --rule NAME --when CEL --decision D` a "
        "[[rules]] policy rule (a user's may ask or deny; with --system, into "
        "/etc/leviath/rules.d, it may also allow).")
    add.add_argument("tool", nargs="?", help="the tool the rule is for (http_post, ...)")
    add.add_argument("--target", metavar="GLOB",
                     help="where the tool may send: a host, path or name glob (*.example.com)")
    add.add_argument("--max-sensitivity", metavar="LEVEL",
                     help="public, internal or private")
    add.add_argument("--rule", metavar="NAME", help="add a [[rules]] policy rule of this name")
    add.add_argument("--when", metavar="CEL", help="the rule's condition (with --rule)")
    add.add_argument("--decision", choices=("allow", "deny", "ask"),
                     help="what the rule decides when it matches (with --rule)")
    add.add_argument("--reason", default="", metavar="TEXT",
                     help="why, shown to the agent and in the audit (with --rule)")
    add.add_argument("--system", action="store_true",
                     help="the machine config, through the daemon "
                          "(polkit org.leviath.config.manage)")
    add.add_argument("--force", action="store_true",
                     help="add a target that matches everything for a tool that sends data out")
    add.set_defaults(func=run_add)

    test = psub.add_parser("test", help="dry-run the gate for one call, printing each step")
    test.add_argument("tool", help="the tool to dry-run (read_file, http_post, ...)")
    test.add_argument("--target", default="", metavar="T", help="path, host or name")
    test.add_argument("--taint", default="public", metavar="LEVEL",
                      help="what the agent has read so far: public (default), internal, private")
    test.add_argument("--agent", default="", help="agent name (per-agent tables)")
    test.add_argument("--blueprint", help="blueprint folder or file (declared read paths)")
    test.add_argument("--workdir", default=".", help="the run's workdir (default: here)")
    test.set_defaults(func=run_test)


def _settings(agent: str, blueprint: str | None) -> PolicySettings:
    machine, user = load_configs()
    bp = load_blueprint(blueprint) if blueprint else None
    name = agent or (bp.agent.name if bp is not None else "")
    return policy_settings(resolve(machine, user, bp, name).agent)


def run_list(args: argparse.Namespace) -> int:
    s = _settings(args.agent or "", args.blueprint)
    table = CompiledPolicy(s, home=str(Path.home()), workdir=os.getcwd())
    rows: list[dict[str, str | None]] = []
    for tool in table.registry.names:
        perm = permission_for(tool, table.permissions, table.registry)
        clearance = table.clearances[tool]
        rows.append({"tool": tool, "permission": perm.permission, "source": perm.source,
                     "clearance": str(clearance) if clearance is not None else None})
    rules = [{"tool": r.tool, "target": r.target, "max_sensitivity": str(r.max_sensitivity)}
             for r in table.allowlist.rules]
    taint = {"enabled": s.taint_enabled, "on_exceed": s.on_exceed, "budget": s.budget,
             "approval_timeout": s.approval_timeout,
             "allow_private_addresses": s.allow_private_addresses}
    policy_rules = [{"layer": r.layer, "name": r.name, "decision": r.decision, "when": r.when,
                     "reason": r.reason} for r in s.rules]
    if args.json:
        print(json.dumps({"tools": rows, "allowlist": rules, "taint": taint,
                          "rules": policy_rules}, indent=2))
        return 0
    print(f"{'TOOL':<12} {'PERMISSION':<10} {'CLEARANCE':<10} SOURCE")
    for r in rows:
        print(f"{r['tool']:<12} {r['permission']:<10} {r['clearance'] or '-':<10} {r['source']}")
    print()
    print("taint: " + ", ".join(f"{k}={v}" for k, v in taint.items()))
    print()
    if not rules:
        print("allowlist: (empty)")
    for i, rule in enumerate(rules, start=1):
        print(f"allowlist #{i}: {rule['tool']} → {rule['target']!r} up to "
              f"{rule['max_sensitivity']}")
    print()
    if not policy_rules:
        print("rules: (none)")
    for pr in policy_rules:
        reason = f"  ({pr['reason']})" if pr["reason"] else ""
        print(f"rule {pr['layer']}:{pr['name']}: {pr['decision']} when {pr['when']}{reason}")
    return 0


def run_add_rule(args: argparse.Namespace) -> int:
    if args.tool is not None or args.target or args.max_sensitivity or args.force:
        raise InvalidArgument("--rule takes --when, --decision and --reason, not a tool, "
                              "--target, --max-sensitivity or --force")
    if not args.when or not args.decision:
        raise InvalidArgument("--rule needs --when CEL and --decision allow|deny|ask")
    if args.system:
        where = asyncio.run(_system_call(
            "RuleAdd", "ssss", [args.rule, args.when, args.decision, args.reason]))
        print(f"added to {where}: rule {args.rule!r}: {args.decision} when {args.when}")
        return 0
    if args.decision == "allow":
        raise InvalidArgument(
            "a user's rule may ask or deny, never allow (rules tighten: only machine rules "
            "allow); use --system with the right to manage the machine config")
    path = user_config_path()
    append_user_rule(path, args.rule, args.when, args.decision, args.reason)
    print(f"added to {path}: rule {args.rule!r}: {args.decision} when {args.when}")
    return 0


def run_add(args: argparse.Namespace) -> int:
    if args.rule is not None:
        return run_add_rule(args)
    if args.when or args.decision or args.reason:
        raise InvalidArgument("--when, --decision and --reason go with --rule NAME")
    if args.tool is None or args.max_sensitivity is None or args.target is None:
        raise InvalidArgument("give TOOL --target GLOB --max-sensitivity LEVEL (an allowlist "
                              "rule), or --rule NAME --when CEL --decision D (a policy rule)")
    level = Sensitivity.parse(args.max_sensitivity)
    if not args.target:
        raise InvalidArgument("--target must not be empty")
    args.tool = checked_tool_name(args.tool)
    known = TOOLS.get(args.tool)
    if known is None:
        print(f"lev: note: {args.tool} is not a built-in tool ({', '.join(TOOLS.names)}); the "
              "rule applies to a tool of that name (an MCP server's or a blueprint's)",
              file=sys.stderr)
    breadth = catch_all(args.target)
    sends = known is not None and known.sends_out is not SendsOut.NEVER
    if breadth == "everything" and sends and not args.force:
        raise InvalidArgument(
            f"--target {args.target!r} matches every target: {args.tool} could send data up to "
            f"{level} anywhere; name the hosts (or pass --force)"
        )
    if breadth is not None:
        print(f"lev: warning: --target {args.target!r} matches {breadth}", file=sys.stderr)
    if args.system:
        where = asyncio.run(_system_add(args.tool, args.target, level))
        print(f"added to {where}: {args.tool} → {args.target!r} up to {level}")
        return 0
    path = user_config_path()
    append_rule(path, args.tool, args.target, level)
    print(f"added to {path}: {args.tool} → {args.target!r} up to {level}")
    return 0


def catch_all(target: str) -> str | None:
    """How much a target glob catches, when it is a catch-all: "everything"
    (`*`, `**`, `?*`), or a whole top-level domain (`*.com`, `*com`, `*.co.uk`)."""
    t = target.strip().lower()
    if t and set(t) <= {"*", "?"}:
        return "everything"
    if t.startswith("*"):
        rest = t.lstrip("*?").lstrip(".")
        labels = rest.split(".") if rest else []
        if not any(c in rest for c in "*?/ ") and (
            len(labels) == 1 or (len(labels) == 2 and len(labels[0]) <= 3)
        ):
            return f"every host under .{rest} (a whole top-level domain)"
    return None


async def _system_add(tool: str, target: str, level: Sensitivity) -> str:
    return await _system_call("PolicyAdd", "sss", [tool, target, str(level)])


async def _system_call(method: str, signature: str, body: list[str]) -> str:
    from leviathd.cli.approvals import policy_call
    from leviathd.cli.client import Client

    client = await Client.connect()
    try:
        (where,) = await policy_call(client, method, signature, body)
    finally:
        client.close()
    return str(where)


def run_test(args: argparse.Namespace) -> int:
    from leviathd.broker.schema import call_for

    s = _settings(args.agent, args.blueprint)
    policy = CompiledPolicy(s, home=str(Path.home()), workdir=os.path.abspath(args.workdir))
    taint = Sensitivity.parse(args.taint)
    tool, target = TOOLS.canonical(args.tool), args.target
    kind = TOOLS.kind_of(tool)
    if kind in (ToolKind.READ, ToolKind.WRITE):
        # The broker decides on the real path of the opened file; the nearest
        # offline stand-in is the realpath of the target now.
        real = os.path.realpath(os.path.join(policy.workdir, target or "."))
        key = "paths" if tool == "read_files" else "path"
        call = call_for(tool, {key: [real] if key == "paths" else real}
                        | ({"content": ""} if tool == "write_file" else {})
                        | ({"old": "x", "new": "y"} if tool == "edit_file" else {}),
                        policy.workdir)
    elif kind is ToolKind.WEB:
        url = target if "://" in target else f"https://{target}/"
        call = call_for(tool, {"url": url} | ({"body": ""} if tool == "http_post" else {}),
                        policy.workdir)
    elif kind is ToolKind.SHELL:
        call = call_for(tool, {"command": target}, policy.workdir)
    elif kind is ToolKind.CREDENTIAL:
        call = call_for(tool, {"name": target}, policy.workdir)
    else:
        from leviathd.policy.decision import Call

        call = Call(tool, target)
    # What rules see of an agent that is not running: who would run it, and
    # which blueprint; the rest of its map is empty and its ledger too.
    bp_name = args.agent or (Path(args.blueprint).name if args.blueprint else "")
    facts = Facts(agent={"id": "", "blueprint": bp_name, "stage": "", "user": _user(),
                         "uid": os.getuid(), "groups": _groups(), "sandbox": "",
                         "network": s.network})
    d = decide(policy, call, taint, facts=facts)
    print(f"{tool} → {call.target or '-'} with taint {taint}")
    for i, step in enumerate(d.steps, start=1):
        print(f"  {i}. {step.check:<10} {step.result:<9} {step.detail}")
    print(f"decision: {d.outcome.upper()} (rule {d.rule}); output would be labelled {d.label}")
    return 0 if d.outcome == "allow" else (2 if d.outcome == "ask" else 1)


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _groups() -> tuple[str, ...]:
    import grp

    out = []
    for gid in os.getgroups():
        try:
            out.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            out.append(str(gid))
    return tuple(out)
