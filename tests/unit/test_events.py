"""Journal event names: one enum (leviathd/events.py), the table in
docs/dbus-api.md equal to it, no name written as a string literal where a
record is made, and no member left that nothing records."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from leviathd.events import Event

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "dbus-api.md"


def _sources() -> list[Path]:
    return sorted(p for p in (ROOT / "leviathd").rglob("*.py") if "__pycache__" not in p.parts)


def test_the_docs_list_exactly_the_events() -> None:
    text = DOC.read_text()
    section = text.split("## Journal events", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([a-z0-9-]+)` \|", section, flags=re.M)
    assert len(listed) == len(set(listed))
    assert set(listed) == {e.value for e in Event}


def test_no_event_is_a_string_literal() -> None:
    found = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.keyword) and node.arg == "LEVIATH_EVENT":
                for sub in ast.walk(node.value):
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                        found.append(f"{path.relative_to(ROOT)}:{node.value.lineno}")
    assert not found, f"use leviathd.events.Event: {found}"


def test_every_event_is_recorded_somewhere() -> None:
    used: set[str] = set()
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "Event"):
                used.add(node.attr)
    assert {e.name for e in Event} - used == set()
