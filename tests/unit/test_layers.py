"""The layers of leviathd (docs/architecture.md, "Layers"), held against the
imports the code has: an import from one part into another must run along an
arrow that the doc's "Allowed arrows" table lists with its reason, the table
lists no arrow the code does not have, and the arrows make no cycle. A wrong
one fails here, with the file, the line and the module it imports. Every
import counts, also one inside a function or under TYPE_CHECKING: a lazy
import is still a dependency.

    python3 tests/unit/test_layers.py    # the arrows table as the code has it
"""

from __future__ import annotations

import ast
import functools
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "leviathd"
DOC = ROOT.parent / "docs" / "architecture.md"

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
    "fdclose": "Ground",
    "reaping": "Ground",
    "loopfd": "Ground",
    "parseshare": "Ground",
    "metrics": "Ground",
    "metricsfile": "Ground",
    "http": "Ground",
    "__init__": "Ground",
}

ALL_PARTS = {"Face", "Edge", "Services", "Broker", "Fence", "Policy", "Config", "Ground"}

# (importer, imported, why): arrows that must never exist, even if the doc
# listed them.
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


@functools.cache
def _arrows() -> tuple[tuple[str, str, int, str, str], ...]:
    """(importer part, imported part, line, file, module) for every import."""
    out = []
    for path in _sources():
        src = _part_of(_module_of(path))
        assert src is not None
        for line, mod in _imports(path.read_text(encoding="utf-8"), _module_of(path)):
            dst = _part_of(mod)
            if dst is not None and mod != "leviathd":
                out.append((src, dst, line, str(path.relative_to(ROOT.parent)), mod))
    return tuple(out)


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


def _table_after(text: str, heading: str) -> list[list[str]]:
    """The body rows (cells, stripped) of the first markdown table after the
    line `heading` in `text`."""
    lines = text.splitlines()
    start = lines.index(heading)
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # (the header and its --- line)


def _doc_arrows(text: str) -> dict[tuple[str, str], str]:
    """(from, to) -> why, from the doc's "Allowed arrows" table."""
    out: dict[tuple[str, str], str] = {}
    for row in _table_after(text, "### Allowed arrows"):
        assert len(row) == 3, f"an arrow row is | from | to | what for |: {row}"
        src, dst, why = row
        assert (src, dst) not in out, f"the arrow {src} -> {dst} is listed twice"
        out[(src, dst)] = why
    return out


def _doc_imports_column(text: str) -> dict[str, set[str]]:
    """part -> the parts its "imports today" cell names, from the doc's parts table."""
    out: dict[str, set[str]] = {}
    for row in _table_after(text, "## Layers"):
        cell = row[-1]
        out[row[0]] = set() if cell == "nothing above it" else {
            p.strip() for p in cell.split(",")}
    return out


def _code_arrows() -> dict[tuple[str, str], list[str]]:
    """(from, to) -> where, for every import from one part into another."""
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for s, d, line, f, mod in _arrows():
        if s != d:
            out[(s, d)].append(f"{f}:{line} imports {mod}")
    return dict(out)


def _cycle(arrows: set[tuple[str, str]]) -> list[str] | None:
    """A cycle of the graph `arrows` as the parts along it, or None."""
    succ: dict[str, list[str]] = defaultdict(list)
    for a, b in sorted(arrows):
        succ[a].append(b)
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node):], node]
        if node in done:
            return None
        for nxt in succ[node]:
            found = walk(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(succ):
        found = walk(start, [])
        if found:
            return found
    return None


def _doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def test_the_doc_lists_each_arrow_between_two_parts_with_its_reason() -> None:
    arrows = _doc_arrows(_doc_text())
    assert arrows, "docs/architecture.md has no Allowed arrows table"
    for (src, dst), why in arrows.items():
        assert {src, dst} <= ALL_PARTS and src != dst, f"not an arrow between parts: {src} -> {dst}"
        assert why, f"the arrow {src} -> {dst} says nothing of why"


def test_every_arrow_in_the_code_is_allowed_by_the_doc() -> None:
    allowed = _doc_arrows(_doc_text())
    new = {a: where for a, where in _code_arrows().items() if a not in allowed}
    assert not new, (
        "arrows the docs/architecture.md \"Allowed arrows\" table does not list; add a row "
        "saying why (or import from a lower part):\n" + "\n".join(
            f"| {s} | {d} | WHY? |   <- {where[0]}" for (s, d), where in sorted(new.items())))


def test_every_arrow_the_doc_allows_is_in_the_code() -> None:
    code = _code_arrows()
    stale = sorted(a for a in _doc_arrows(_doc_text()) if a not in code)
    assert not stale, ("rows of docs/architecture.md's \"Allowed arrows\" no import needs any "
                       f"more (remove them): {stale}")


def test_the_parts_table_shows_the_arrows() -> None:
    """The "imports today" column of the parts table names the same parts as
    the arrows table, so it cannot go stale."""
    text = _doc_text()
    column = _doc_imports_column(text)
    assert set(column) == ALL_PARTS
    want: dict[str, set[str]] = {p: set() for p in ALL_PARTS}
    for src, dst in _doc_arrows(text):
        want[src].add(dst)
    wrong = {p: sorted(want[p]) for p in ALL_PARTS if column[p] != want[p]}
    assert not wrong, f"the parts table's \"imports today\" should read: {wrong}"


def test_no_allowed_arrow_is_forbidden() -> None:
    allowed = _doc_arrows(_doc_text())
    listed = [f"{s} -> {d} ({why})" for s, d, why in FORBIDDEN if (s, d) in allowed]
    assert not listed, "the doc allows forbidden arrows:\n" + "\n".join(listed)


def test_the_parts_graph_has_no_cycle() -> None:
    arrows = set(_code_arrows()) | set(_doc_arrows(_doc_text()))
    cycle = _cycle(arrows)
    assert cycle is None, "the parts import each other in a circle: " + " -> ".join(cycle or [])


def test_the_doc_and_cycle_checks_see_what_they_look_for() -> None:
    """The parsers read a table like the doc's, and the cycle check finds a
    cycle of three (the form Policy -> Broker -> Fence -> ... took), so the
    tests above cannot pass by seeing nothing."""
    text = ("## Layers\n\n| part | files | job | imports today |\n| --- | --- | --- | --- |\n"
            "| Face | `cli/` | x | Edge, Ground |\n| Ground | y | z | nothing above it |\n\n"
            "### Allowed arrows\n\n| from | to | what for |\n| --- | --- | --- |\n"
            "| Face | Edge | the names |\n| Face | Ground | errors |\n\nafter\n")
    assert _doc_arrows(text) == {("Face", "Edge"): "the names", ("Face", "Ground"): "errors"}
    assert _doc_imports_column(text) == {"Face": {"Edge", "Ground"}, "Ground": set()}
    assert _cycle({("A", "B"), ("B", "C"), ("C", "A"), ("A", "D")}) == ["A", "B", "C", "A"]
    assert _cycle({("A", "B"), ("B", "C"), ("A", "C")}) is None


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


def _print_table() -> None:
    """The "Allowed arrows" rows as the code has them: the doc's reason where
    it has one, WHY? and an example import where it has none; the rows the
    code no longer needs are left out (named on stderr)."""
    allowed = _doc_arrows(_doc_text())
    code = _code_arrows()
    order = ["Face", "Edge", "Services", "Broker", "Fence", "Policy", "Config", "Ground"]
    for (src, dst), where in sorted(code.items(), key=lambda a: (order.index(a[0][0]),
                                                                  order.index(a[0][1]))):
        why = allowed.get((src, dst)) or f"WHY? ({where[0]})"
        print(f"| {src} | {dst} | {why} |")
    for src, dst in sorted(set(allowed) - set(code)):
        print(f"no longer in the code: {src} -> {dst}", file=sys.stderr)
    column = {p: ", ".join(d for d in order if (p, d) in code) or "nothing above it"
              for p in order}
    print("\nimports today: " + "; ".join(f"{p}: {c}" for p, c in column.items()), file=sys.stderr)


if __name__ == "__main__":
    _print_table()
