"""`lev validate PATH|NAME [--json] [--deny-warnings]`: is this blueprint valid, and what
will your config let it do? Local: reads files only, no daemon.

Output (the spec's):

    ✓ Blueprint 'cto' is valid.
      3 stages, version 1.0.0
      WARN your config does not grant glob:~/design-docs/**: reads matching them will be
           refused [read-paths-not-granted]            (one line; wrapped here)
           add to your config.toml: [agent_read_paths.cto] allow = ["glob:~/design-docs/**"]
      NOTE declares [read_paths] (reads outside the run workdir): 2 declared, 1 granted
           [read-paths-declared]                        (one line; wrapped here)
           ~/.leviath/runs: granted; glob:~/design-docs/**: NOT granted

Exit status: 0 valid, 1 invalid, 2 valid but with warnings under --deny-warnings.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leviathd.config.agent_store import blueprint_folder
from leviathd.config.load import BLUEPRINT_FILE, agent_store_path, load_blueprint, load_configs
from leviathd.config.merge import Finding, MergeResult, resolve
from leviathd.config.models import Blueprint
from leviathd.errors import ConfigError, NotFound
from leviathd.safetext import NAME_RE

EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_WARNINGS = 2

_ORDER = {"error": 0, "warn": 1, "note": 2}


@dataclass
class Report:
    """What `lev validate`, `lev add` and `lev list` say about one blueprint."""

    path: Path
    blueprint: Blueprint | None = None
    result: MergeResult | None = None
    errors: list[str] = field(default_factory=list)  # parse errors, one per line

    @property
    def findings(self) -> list[Finding]:
        found = self.result.findings if self.result else []
        return sorted(found, key=lambda f: _ORDER[f.level])

    @property
    def valid(self) -> bool:
        return self.blueprint is not None and not any(f.level == "error" for f in self.findings)

    @property
    def has_warnings(self) -> bool:
        return any(f.level == "warn" for f in self.findings)

    def exit_status(self, deny_warnings: bool = False) -> int:
        if not self.valid:
            return EXIT_INVALID
        if deny_warnings and self.has_warnings:
            return EXIT_WARNINGS
        return EXIT_VALID


def check(folder: Path) -> Report:
    """Validate the blueprint in `folder` against the machine's and the caller's config.
    A broken blueprint is reported, not raised; a broken config is raised (ConfigError),
    because then nothing about the blueprint can be said."""
    report = Report(path=folder / BLUEPRINT_FILE)
    try:
        report.blueprint = load_blueprint(folder)
    except ConfigError as exc:
        report.errors = str(exc).splitlines()
        return report
    machine, user = load_configs()
    report.result = resolve(machine, user, report.blueprint, report.blueprint.agent.name)
    return report


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def render(report: Report) -> list[str]:
    """The human-readable report, one string per line."""
    bp = report.blueprint
    if bp is None:
        return [f"✗ Blueprint at {report.path.parent} is invalid."] + [
            f"  ERROR {line}" for line in report.errors
        ]
    head = "✓" if report.valid else "✗"
    verdict = "is valid." if report.valid else "is invalid."
    lines = [
        f"{head} Blueprint '{bp.agent.name}' {verdict}",
        f"  {_plural(len(bp.stages), 'stage')}, version {bp.agent.version}",
    ]
    for f in report.findings:
        label = {"error": "ERROR", "warn": "WARN", "note": "NOTE"}[f.level]
        lines.append(f"  {label} {f.message} [{f.code}]")
        if f.hint:
            lines.append(f"       {f.hint}")
    return lines


def as_json(report: Report) -> dict[str, Any]:
    bp = report.blueprint
    data: dict[str, Any] = {
        "path": str(report.path),
        "valid": report.valid,
        "errors": report.errors,
        "findings": [
            {"level": f.level, "code": f.code, "message": f.message, "hint": f.hint}
            for f in report.findings
        ],
    }
    if bp is not None:
        data.update(
            name=bp.agent.name,
            version=bp.agent.version,
            description=bp.agent.description,
            stages=list(bp.stages),
        )
    if report.result is not None:
        data["read_paths"] = {
            "declared": report.result.agent.read_paths_declared,
            "granted": report.result.agent.read_paths_granted,
        }
    return data


def _folder(arg: str) -> Path:
    """As for `lev run`: a bare name is the installed agent only, never a
    folder of that name here (an agent may have planted one); `./NAME` for it."""
    if not NAME_RE.match(arg):
        return blueprint_folder(arg)
    store = agent_store_path()
    if not (store / arg / BLUEPRINT_FILE).is_file():
        hint = f"; for the folder here, say ./{arg}" if Path(arg).exists() else ""
        raise NotFound(f"{arg}: no such blueprint (no agent of that name installed in "
                       f"{store}){hint}")
    return store / arg


def _run(args: argparse.Namespace) -> int:
    report = check(_folder(args.blueprint))
    if args.json:
        data = as_json(report)
        data["exit"] = report.exit_status(args.deny_warnings)
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print("\n".join(render(report)))
    return report.exit_status(args.deny_warnings)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "validate",
        help="check a blueprint and what your config lets it do (no daemon needed)",
        description="Check a blueprint (a folder, its blueprint.toml, or an installed "
        "agent's name) against the machine's and your config.toml. Exit status: 0 valid, "
        "1 invalid, 2 valid with warnings when --deny-warnings is given.",
    )
    p.add_argument("blueprint", metavar="PATH|NAME",
                   help="an installed agent's name, or a blueprint folder or file (./NAME here)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--deny-warnings", action="store_true", help="exit 2 when there are warnings")
    p.set_defaults(func=_run)
