"""The layers of leviathd (docs/architecture.md, "Layers"), held against the
imports the code has: an arrow that runs the wrong way fails here, with the
file, the line and the module it imports. Every import counts, also one
inside a function or under TYPE_CHECKING: a lazy import is still a
dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "leviathd"

# Each module or package of leviathd/ and the part it belongs to. A new module
# must be placed here (and in docs/architecture.md) before the test passes.
PARTS: dict[str, str] = {
    "cli": "Face",
    "bus": "Edge",
    "daemon": "Edge",
    "agents": "Services",
    "audit": "Services",
    "gate": "Services",
    "proxy": "Services",
    "enginesock": "Services",
    "creds": "Services",
    "broker": "Broker",
    "sandbox": "Fence",
    "policy": "Policy",
    "config": "Config",
    "domain": "Ground",
    "paths": "Ground",
    "events": "Ground",
    "readpatterns": "Ground",
    "authority": "Ground",
    "systemd": "Ground",
    "identity": "Ground",
    "userfiles": "Ground",
    "records": "Ground",
    "listing": "Ground",
    "errors": "Ground",
    "fsat": "Ground",
    "fanotify": "Ground",
    "inotify": "Ground",
    "hidden": "Ground",
    "safetext": "Ground",
    "resource_defaults": "Ground",
    "heap": "Ground",
    "fsids": "Ground",
    "budget": "Ground",
    "hosts": "Ground",
    "fdshare": "Ground",
    "parseshare": "Ground",
    "__init__": "Ground",
}

ALL_PARTS = {"Face", "Edge", "Services", "Broker", "Fence", "Policy", "Config", "Ground"}

# (importer, imported, why): arrows that must never exist.
FORBIDDEN: list[tuple[str, str, str]] = [
    ("Edge", "Face", "the daemon must not depend on its own client"),
    ("Services", "Edge", "authorisation and D-Bus stay at the edge"),
    ("Fence", "Config", "the spec is built from a plain request"),
    ("Policy", "Services", "the pure decisions know no daemon"),
    *[("Ground", p, "the ground floor imports nothing above it")
      for p in sorted(ALL_PARTS - {"Ground"})],
]


def _part_of(module: str) -> str | None:
    """The part of a dotted module name under leviathd (None: not ours)."""
    bits = module.split(".")
    if bits[0] != "leviathd":
        return None
    if len(bits) == 1:
        return "Ground"
    return PARTS.get(bits[1], f"unplaced:{bits[1]}")


def _sources() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    return ".".join(rel.parts)


def _imports(text: str, module: str) -> list[tuple[int, str]]:
    """Every leviathd module that the source `text` of `module` imports, with the line."""
    return [(line, m) for line, m in _all_imports(text, module) if m.split(".")[0] == "leviathd"]


def _all_imports(text: str, module: str) -> list[tuple[int, str]]:
    """Every module (ours or not) that the source `text` of `module` imports, with the line."""
    tree = ast.parse(text)
    package = module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, *([base] if base else [])])
            found.append((node.lineno, base))
            if base == "leviathd":  # `from leviathd import fsat` imports leviathd.fsat
                found += [(node.lineno, f"leviathd.{a.name}") for a in node.names
                          if (ROOT / f"{a.name}.py").exists() or (ROOT / a.name).is_dir()]
    return found


def _arrows() -> list[tuple[str, str, int, str, str]]:
    """(importer part, imported part, line, file, module) for every import."""
    out = []
    for path in _sources():
        src = _part_of(_module_of(path))
        assert src is not None
        for line, mod in _imports(path.read_text(encoding="utf-8"), _module_of(path)):
            dst = _part_of(mod)
            if dst is not None and mod != "leviathd":
                out.append((src, dst, line, str(path.relative_to(ROOT.parent)), mod))
    return out


def test_every_module_is_placed_in_a_part() -> None:
    top = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
           if (p.is_file() and p.suffix == ".py") or (p / "__init__.py").exists()
           or (p.is_dir() and any(p.glob("*.py")))}
    unplaced = sorted(top - set(PARTS))
    assert not unplaced, f"place these in PARTS and docs/architecture.md: {unplaced}"


def test_the_layout_shows_the_layers() -> None:
    """A module at the top of leviathd/ is the ground floor (daemon.py, the
    composition root, aside); every other part lives in folders of its own,
    so a new service cannot sit beside fsat.py unnoticed."""
    top_modules = sorted(p.stem for p in ROOT.glob("*.py"))
    misplaced = [m for m in top_modules if PARTS.get(m) != "Ground" and m != "daemon"]
    assert not misplaced, f"move these into their part's folder: {misplaced}"


@pytest.mark.parametrize(("importer", "imported", "why"), FORBIDDEN)
def test_no_arrow_runs_the_wrong_way(importer: str, imported: str, why: str) -> None:
    wrong = [f"{f}:{line} imports {mod}" for s, d, line, f, mod in _arrows()
             if s == importer and d == imported]
    assert not wrong, f"{importer} -> {imported} ({why}):\n" + "\n".join(wrong)


def test_the_checker_sees_a_wrong_arrow() -> None:
    """The parser finds a lazy import inside a function (the form the bus's
    old import of the CLI took) and a relative one, so the test above cannot
    pass by missing them."""
    text = ("def f():\n    from leviathd.cli.policy import append_rule\n"
            "from ..bus import polkit\nfrom leviathd import fsat\n")
    mods = {m for _line, m in _imports(text, "leviathd.policy.x")}
    assert {"leviathd.cli.policy", "leviathd.bus", "leviathd.fsat"} <= mods
    assert _part_of("leviathd.cli.policy") == "Face"
    assert _part_of("leviathd.bus") == "Edge"


# The only modules that may speak D-Bus (import dbus_fast), and why. The
# services take plain interfaces instead (an Authority, a CallerWatch, the
# SystemdManager object), so they can be unit-tested with in-memory
# stand-ins (tests/unit/test_agents_service.py).
SPEAKS_DBUS: dict[str, str] = {
    "leviathd.bus": "the edge: the daemon's interfaces, polkit, callers",
    "leviathd.daemon": "the composition root: connects the bus and hands it to the edge",
    "leviathd.cli": "the client: a separate program that calls the daemon over the bus",
    "leviathd.systemd.manager": "the client of PID 1, whose API is D-Bus (given to services "
                                "as an object)",
    "leviathd.systemd.absent": "the no-systemd stand-in of SystemdManager, built like it",
}


def _may_speak_dbus(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in SPEAKS_DBUS)


def _dbus_imports() -> list[str]:
    return [f"{path.relative_to(ROOT.parent)}:{line} imports {mod}"
            for path in _sources() if not _may_speak_dbus(_module_of(path))
            for line, mod in _all_imports(path.read_text(encoding="utf-8"), _module_of(path))
            if mod.split(".")[0] == "dbus_fast"]


def test_only_the_edge_speaks_dbus() -> None:
    wrong = _dbus_imports()
    assert not wrong, "D-Bus outside the edge (take a plain interface instead):\n" + "\n".join(
        wrong)


def test_the_dbus_check_sees_a_service_import() -> None:
    text = "def f():\n    from dbus_fast.aio import MessageBus\nimport dbus_fast\n"
    mods = {m for _line, m in _all_imports(text, "leviathd.agents.service")}
    assert {"dbus_fast.aio", "dbus_fast"} <= mods
    assert not _may_speak_dbus("leviathd.agents.service")
    assert _may_speak_dbus("leviathd.bus.caller_watch")
