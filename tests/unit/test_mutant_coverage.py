"""Issue 50: every security module has mutants (tests/mutants/mutants.toml).

A module under leviathd/proxy/, enginesock/, broker/, sandbox/ (recursively)
or bus/ makes promises the tests must hold to; a mutant (one weakened line,
`bash scripts/mutants --file MODULE`) shows that a test notices when one is
broken. This fails for a module with no mutant, unless it is named below:

- EXEMPT: modules with no security promise of their own (a package's
  docstring, a table of names, a typing shim), each with the reason;
- PENDING: security modules whose mutants are still to be written, each
  with what they promise; a debt listed in the open, not a pass. Each entry
  leaves the list when its first mutant lands.

A new module (another branch's) therefore fails this test until its change
adds its mutants (or names it here with a reason): nothing is exempt by a
pattern. The list of mutants is also checked for being current: each one's
text must be found exactly once in its file, as scripts/mutants needs it.
"""

from __future__ import annotations

import tomllib
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("proxy", "enginesock", "broker", "sandbox", "bus")

EXEMPT = {
    "leviathd/proxy/__init__.py": "a package marker",
    "leviathd/enginesock/__init__.py": "the package's docstring only",
    "leviathd/broker/__init__.py": "the package's docstring only",
    "leviathd/sandbox/__init__.py": "a package marker",
    "leviathd/sandbox/container/__init__.py": "the package's docstring and re-exports",
    "leviathd/bus/__init__.py": "a package marker",
    "leviathd/bus/names.py": "the bus names and polkit action ids as constants; "
                             "test_bus_methods holds them to the policy file",
    "leviathd/enginesock/refused.py": "the engine socket's error class",
}

PENDING: dict[str, str] = {
    "leviathd/enginesock/imagestore.py":
        "each user's image store is that user's alone; it is so twice over (named by uid, and "
        "the user's own 0700 folder), and a mutant of either alone survives: store_name "
        "returning one name for all users survived test_engine_images -k never_bobs, since "
        "bob's copy, as bob, cannot open alice's folder",
}


def _modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for folder in FOLDERS
                  for p in (ROOT / "leviathd" / folder).rglob("*.py"))


def _mutants() -> list[dict[str, object]]:
    table = tomllib.loads((ROOT / "tests/mutants/mutants.toml").read_text())
    return list(table["mutant"])


def test_every_security_module_has_a_mutant_or_says_why_not() -> None:
    by_file = Counter(str(m["file"]) for m in _mutants())
    missing = [m for m in _modules() if not by_file[m] and m not in EXEMPT and m not in PENDING]
    assert not missing, (
        f"security modules with no mutant in tests/mutants/mutants.toml: {missing}; add one "
        "per promise (a check, a bound, a refusal) with the test that kills it, or name the "
        "module in EXEMPT (no security promise) with its reason")


def test_an_exempt_module_exists_and_has_no_mutant() -> None:
    by_file = Counter(str(m["file"]) for m in _mutants())
    modules = set(_modules())
    for name in EXEMPT:
        assert name in modules, f"EXEMPT names {name}, which is not a module here"
        assert not by_file[name], f"{name} has mutants: it is not exempt"
    for name in PENDING:
        assert name in modules, f"PENDING names {name}, which is not a module here"
        assert not by_file[name], f"{name} has mutants now: take it off PENDING"


@pytest.mark.parametrize("mutant", _mutants(), ids=lambda m: str(m["name"]))
def test_each_mutant_applies_once_and_names_its_tests(mutant: dict[str, object]) -> None:
    path = ROOT / str(mutant["file"])
    assert path.is_file(), f"{mutant['file']} is not a file"
    assert path.read_text().count(str(mutant["find"])) == 1, (
        f"its text is not found exactly once in {mutant['file']}: re-point it at the code")
    tests = mutant["tests"]
    assert isinstance(tests, list) and tests and str(tests[0]).startswith("tests/"), tests
    assert mutant["find"] != mutant["replace"]
