"""Every mutant in tests/mutants/mutants.toml still applies to the code.

`bash scripts/mutants` boots a test bed per mutant, so it is opt-in and not in
CI; but a mutant whose `find` no longer matches (the code moved or was
reworded) guards nothing, and until now that was only seen when someone ran
it. This keeps the list honest at every commit, at the cost of reading files.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_mutant_names_a_file_and_text_that_exist() -> None:
    with open(REPO / "tests" / "mutants" / "mutants.toml", "rb") as f:
        mutants = tomllib.load(f)["mutant"]
    assert mutants
    stale = []
    for m in mutants:
        path = REPO / m["file"]
        if not path.is_file():
            stale.append(f"{m['name']}: no file {m['file']}")
        elif m["find"] not in path.read_text():
            stale.append(f"{m['name']}: its find is not in {m['file']}")
        elif m["find"] == m["replace"]:
            stale.append(f"{m['name']}: find and replace are the same")
    assert not stale, "\n".join(stale)
