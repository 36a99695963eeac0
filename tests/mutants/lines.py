"""Line mutants of one module, found mechanically (a sweep, not the curated
table of mutants.toml): each comparison, boolean operator, `not`, `+`/`-`,
number (also those in a regex's text), True/False/None and simple statement
of the file is changed alone, in a throwaway copy of the checkout, and the
tests named are run there. Prints each mutant as killed or SURVIVED.

    python tests/mutants/lines.py leviathd/safetext.py tests/unit/test_safetext.py ...
"""

from __future__ import annotations

import ast
import io
import re
import shutil
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path

PYTEST = "/opt/leviath-dev/venv/bin/pytest"
SWAP = {
    "<": ["<=", ">"], "<=": ["<", ">"], ">": [">=", "<"], ">=": [">", "<"],
    "==": ["!="], "!=": ["=="], "+": ["-"], "-": ["+"],
    "and": ["or"], "or": ["and"], "is": ["is not"], "in": ["not in"],
    "True": ["False"], "False": ["True"], "None": ["0"],
    "all": ["any"], "any": ["all"], "max": ["min"], "min": ["max"],
}


def _skipped_lines(tree: ast.Module) -> set[int]:
    # Docstrings, imports and raise statements' messages: not behaviour.
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Raise)) or (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            out.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return out


def mutants(src: str) -> list[tuple[int, str, str]]:
    """(line number, description, mutated source) for each mutant."""
    lines = src.splitlines(keepends=True)
    tree = ast.parse(src)
    skip = _skipped_lines(tree)
    out: list[tuple[int, str, str]] = []

    def put(row: int, col: int, old: str, new: str) -> None:
        line = lines[row - 1]
        assert line[col:col + len(old)] == old
        mutated = line[:col] + new + line[col + len(old):]
        out.append((row, f"{line.strip()!r}: {old!r} -> {new!r}",
                    "".join([*lines[:row - 1], mutated, *lines[row:]])))

    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    for k, tok in enumerate(toks):
        (row, col), s = tok.start, tok.string
        if row in skip:
            continue
        nxt = toks[k + 1].string if k + 1 < len(toks) else ""
        prev = toks[k - 1].string if k else ""
        if tok.type == tokenize.NUMBER and s.isdigit():
            n = int(s)
            for m in sorted({n + 1, n - 1 if n else 1} - {n}):
                put(row, col, s, str(m))
        elif tok.type == tokenize.STRING and re.search(r"\{\d+,\d+\}", s):
            # A regex's bounds.
            for mm in re.finditer(r"(?<=[{,])\d+(?=[,}])", s):
                n = int(mm.group())
                for m in (n + 1, n - 1):
                    if m >= 0:
                        put(row, col + mm.start(), mm.group(), str(m))
        elif s == "not" and nxt != "in" and prev != "is":
            put(row, col, "not ", "")
        elif s == "is" and nxt == "not":
            put(row, col, "is not", "is")
        elif s == "not" and nxt == "in":
            put(row, col, "not in", "in")
        elif s == "in" and prev != "not" and prev != "for" and tok.type == tokenize.NAME:
            # `for x in`: the loop's `in` is not a test.
            if not any(t.string == "for" for t in toks[max(0, k - 8):k]
                       if t.start[0] == row):
                put(row, col, "in", "not in")
        elif s in SWAP and prev != "->" and not (
                s in "+-" and prev in ("(", ",", "[", "=", "return")):
            if s == "is" and nxt == "not":
                continue
            for new in SWAP[s]:
                put(row, col, s, new)
    # Each element of a tuple tested by `in`, left out.
    for node in ast.walk(tree):
        if (isinstance(node, ast.Compare) and isinstance(node.comparators[0], ast.Tuple)
                and node.lineno not in skip):
            for elt in node.comparators[0].elts:
                if isinstance(elt, (ast.Constant, ast.Attribute)) and elt.lineno == elt.end_lineno:
                    seg = ast.get_source_segment(src, elt) or ""
                    line = lines[elt.lineno - 1]
                    col = len(line.encode()[:elt.col_offset].decode())
                    end = col + len(seg)
                    if line[end:end + 2] == ", ":
                        put(elt.lineno, col, line[col:end + 2], "")
                    elif line[col - 2:col] == ", ":
                        put(elt.lineno, col - 2, line[col - 2:end], "")
    # Simple statements on one line, dropped (not a module's constants: a
    # NameError is no test's merit).
    for node in ast.walk(tree):
        if (isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr, ast.Continue, ast.Return))
                and node.lineno == node.end_lineno and node.lineno not in skip
                and node.col_offset > 0):
            line = lines[node.lineno - 1]
            indent = line[:len(line) - len(line.lstrip())]
            if node.col_offset != len(indent):
                continue  # not alone on its line
            out.append((node.lineno, f"{line.strip()!r}: statement -> pass",
                        "".join([*lines[:node.lineno - 1], indent + "pass\n",
                                 *lines[node.lineno:]])))
    return sorted(out, key=lambda m: m[0])


def copy_checkout(src: Path, dest: Path) -> None:
    files = subprocess.run(["git", "-C", str(src), "ls-files", "-co", "--exclude-standard"],
                           check=True, capture_output=True, text=True).stdout.split()
    for rel in files:
        if (src / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dest / rel)


def main() -> int:
    checkout = Path(__file__).resolve().parents[2]
    rel, tests = sys.argv[1], sys.argv[2:]
    only = None
    if tests and tests[0].startswith("--lines="):
        only = {int(n) for n in tests.pop(0).split("=", 1)[1].split(",")}
    survived = killed = 0
    with tempfile.TemporaryDirectory(prefix="leviath-lines.", dir="/var/tmp") as tmp:
        copy = Path(tmp)
        copy_checkout(checkout, copy)
        path = copy / rel
        original = path.read_text()
        for row, what, text in mutants(original):
            if only and row not in only:
                continue
            path.write_text(text)
            try:
                r = subprocess.run([PYTEST, "-q", "-x", "-p", "no:cacheprovider", *tests],
                                   cwd=copy, capture_output=True, text=True, timeout=300)
                code = r.returncode
            except subprocess.TimeoutExpired:
                code = -1  # a hang is a kill too: the test did not pass
            finally:
                path.write_text(original)
            if code == 0:
                survived += 1
                print(f"SURVIVED  {rel}:{row} {what}", flush=True)
            else:
                killed += 1
                print(f"killed    {rel}:{row} {what} (exit {code})", flush=True)
    print(f"{rel}: {killed + survived} mutants, {killed} killed, {survived} survived")
    return 0


if __name__ == "__main__":
    sys.exit(main())
