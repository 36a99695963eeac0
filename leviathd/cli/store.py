"""`lev add PATH [--force]` and `lev list [--json]`: the local agent store. No daemon."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from leviathd.cli.validate import EXIT_VALID, Report, as_json, check, render
from leviathd.config.agent_store import install, list_installed
from leviathd.config.load import load_configs
from leviathd.config.merge import resolve


def _add(args: argparse.Namespace) -> int:
    dest, blueprint = install(args.path, force=args.force)
    print(f"Installed '{blueprint.agent.name}' into {dest}")
    report = check(dest)
    print("\n".join(render(report)))
    return EXIT_VALID


def _list(args: argparse.Namespace) -> int:
    agents = list_installed()
    machine, user = load_configs()
    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    for agent in agents:
        if agent.blueprint is None:
            rows.append(
                {
                    "name": agent.name,
                    "path": str(agent.path),
                    "valid": False,
                    "errors": (agent.error or "").splitlines(),
                }
            )
            first = (agent.error or "").splitlines()[:1]
            lines.append(f"{agent.name}  (broken)")
            lines.extend(f"  {e}" for e in first)
            continue
        bp = agent.blueprint
        result = resolve(machine, user, bp, bp.agent.name)
        report = Report(path=agent.path / "blueprint.toml", blueprint=bp, result=result)
        row = as_json(report)
        row["folders"] = [{"path": f.path, "access": str(f.access), "repository": f.repository}
                          for f in result.agent.folders]
        rows.append(row)
        declared = result.agent.read_paths_declared
        granted = result.agent.read_paths_granted
        stages = len(bp.stages)
        title = f"{bp.agent.name}  {bp.agent.version}  {stages} stage{'' if stages == 1 else 's'}"
        lines.append(title + (f"  {bp.agent.description}" if bp.agent.description else ""))
        if declared:
            lines.append(
                f"  reads outside the workdir: {len(granted)}/{len(declared)} granted"
                + (
                    ""
                    if len(granted) == len(declared)
                    else f" (not granted: {', '.join(d for d in declared if d not in granted)})"
                )
            )
        for f in result.agent.folders:
            access = "read-write" if str(f.access) == "write" else "read-only"
            where = f" when in {f.repository}" if f.repository else ""
            lines.append(f"  folder {f.path} ({access}){where}")
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif not agents:
        print("No agents installed. Install one with: lev add PATH")
    else:
        print("\n".join(lines))
    return EXIT_VALID


def register(subparsers: Any) -> None:
    add = subparsers.add_parser(
        "add",
        help="install a blueprint folder into your agent store",
        description="Validate a blueprint folder and copy it into your agent store "
        "(~/.local/share/leviath/agents/NAME, or $LEVIATH_AGENT_STORE). An installed "
        "agent is replaced only with --force.",
    )
    add.add_argument("path", metavar="PATH", help="a folder holding blueprint.toml")
    add.add_argument("--force", action="store_true", help="replace an installed agent")
    add.set_defaults(func=_add)

    ls = subparsers.add_parser(
        "list",
        help="list installed agents with their read-path grants",
        description="List the agents in your store, with how many of the read paths "
        "each declares your config grants.",
    )
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=_list)
