"""Line-by-line mutation sweep of one source file: each comparison, `and`/`or`,
`not`, `in`, `is`, True/False, integer, string constant and slice outside an
error message is mutated alone, in a copy of the checkout, and the given
(unit) tests run there; one JSON line per mutant, `killed` or `SURVIVED`.

    python3 tests/mutants/sweep.py leviathd/proxy/policy.py tests/unit/test_proxy_policy.py
    ... --strings            # string constants too (many, mostly names)
    ... --shard 1/2          # every second mutant, for two runs side by side

A survivor is either equivalent (say why) or a test to write; the important
ones go to mutants.toml (docs/testing.md). Unlike scripts/mutants this is
for finding them, not a gate: expect equivalent survivors.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import tokenize
from collections.abc import Iterator
from pathlib import Path

from run import PYTEST, copy_checkout

CHECKOUT = Path(__file__).resolve().parents[2]
COMPARE = {"==": "!=", "!=": "==", "<": "<=", "<=": "<", ">": ">=", ">=": ">"}
# Calls whose arguments are messages: mutating them only rewords an error.
MESSAGES = frozenset({"Refused", "BindRefused", "ValueError", "BadRequest"})

Mutant = tuple[int, int, int, str, str]  # line, start, end, replacement, what


def _tokens(text: str) -> list[tokenize.TokenInfo]:
    skip = (tokenize.NL, tokenize.COMMENT)
    return [t for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type not in skip]


def _token_mutants(toks: list[tokenize.TokenInfo]) -> Iterator[Mutant]:
    depth = 0
    message_depth: int | None = None
    for i, t in enumerate(toks):
        prev = toks[i - 1] if i else None
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        s = t.string
        if t.type == tokenize.OP and s in "([{":
            depth += 1
            if prev is not None and prev.string in MESSAGES and message_depth is None:
                message_depth = depth
            continue
        if t.type == tokenize.OP and s in ")]}":
            if message_depth == depth:
                message_depth = None
            depth -= 1
            continue
        if message_depth is not None or t.start[0] != t.end[0]:
            continue
        (row, col), end = t.start, t.end[1]
        same_line_next = nxt is not None and nxt.start[0] == row
        if t.type == tokenize.OP and s in COMPARE:
            yield row, col, end, COMPARE[s], f"{s} -> {COMPARE[s]}"
        elif t.type == tokenize.NAME and s in ("and", "or"):
            other = "or" if s == "and" else "and"
            yield row, col, end, other, f"{s} -> {other}"
        elif t.type == tokenize.NAME and s == "not":
            if prev is not None and prev.string == "is":
                continue
            if nxt is not None and nxt.string == "in" and same_line_next:
                yield row, col, nxt.end[1], "in", "not in -> in"
            else:
                yield row, col, nxt.start[1] if nxt and same_line_next else end, "", "drop not"
        elif t.type == tokenize.NAME and s == "in":
            code = t.line[:col]
            if prev is not None and prev.string != "not" and not t.line.lstrip().startswith(
                    "for ") and " for " not in code:
                yield row, col, end, "not in", "in -> not in"
        elif t.type == tokenize.NAME and s == "is":
            if nxt is not None and nxt.string == "not":
                yield row, col, nxt.end[1], "is", "is not -> is"
            else:
                yield row, col, end, "is not", "is -> is not"
        elif t.type == tokenize.NAME and s in ("True", "False"):
            other = "False" if s == "True" else "True"
            yield row, col, end, other, f"{s} -> {other}"
        elif t.type == tokenize.NUMBER:
            try:
                n = int(s, 0)
            except ValueError:
                continue
            yield row, col, end, str(n + 1), f"{s} -> {n + 1}"
            if n > 1:
                yield row, col, end, str(n - 1), f"{s} -> {n - 1}"
        elif t.type == tokenize.STRING:
            if s.lower().startswith(("f", "rf", "fr", "b", "rb", "br")) or s[:3] in ('"""', "'''"):
                continue
            if prev is None or prev.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                continue  # a docstring
            if s in ('""', "''"):
                yield row, col, end, '"\\x00mutant"', "'' -> 'mutant'"
            else:
                yield row, col, end, '""', f"{s[:40]} -> ''"


def _slice_mutants(toks: list[tokenize.TokenInfo]) -> Iterator[Mutant]:
    """x[a:b] -> x, where the subscript is on one line."""
    for i, t in enumerate(toks):
        if t.string != "[" or i == 0 or not (
                toks[i - 1].type in (tokenize.NAME, tokenize.STRING)
                or toks[i - 1].string in (")", "]")):
            continue
        depth, j, colon = 0, i, False
        while j < len(toks):
            if toks[j].string in "([{":
                depth += 1
            elif toks[j].string in ")]}":
                depth -= 1
                if depth == 0:
                    break
            elif toks[j].string == ":" and depth == 1:
                colon = True
            j += 1
        if colon and j < len(toks) and toks[j].start[0] == t.start[0]:
            yield t.start[0], t.start[1], toks[j].end[1], "", "drop slice"


def mutants(text: str) -> list[Mutant]:
    toks = _tokens(text)
    return [*_token_mutants(toks), *_slice_mutants(toks)]


def is_string(m: Mutant) -> bool:
    return m[4].endswith(("-> ''", "-> 'mutant'"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="the source file, relative to the checkout")
    ap.add_argument("tests", nargs="+", help="pytest arguments (the unit tests of the file)")
    ap.add_argument("--strings", action="store_true", help="mutate string constants too")
    ap.add_argument("--shard", default="0/1", help="K/N: only mutants K, K+N, K+2N, ...")
    args = ap.parse_args()
    k, n = (int(x) for x in args.shard.split("/"))
    with tempfile.TemporaryDirectory(prefix="leviath-sweep.", dir="/var/tmp") as tmp:
        copy = Path(tmp)
        copy_checkout(CHECKOUT, copy)
        path = copy / args.file
        original = path.read_text()
        lines = original.splitlines(keepends=True)
        todo = [m for m in mutants(original) if args.strings or not is_string(m)]
        survived = 0
        for index, (row, start, end, replacement, what) in enumerate(todo):
            if index % n != k:
                continue
            line = lines[row - 1][:start] + replacement + lines[row - 1][end:]
            text = "".join([*lines[:row - 1], line, *lines[row:]])
            try:
                compile(text, args.file, "exec")
            except SyntaxError:
                continue
            path.write_text(text)
            r = subprocess.run([PYTEST, "-q", "-x", "-p", "no:cacheprovider", *args.tests],
                               cwd=copy, capture_output=True, text=True)
            result = "killed" if r.returncode == 1 else f"SURVIVED (pytest exit {r.returncode})"
            survived += result != "killed"
            print(json.dumps({"line": row, "mutant": what, "result": result,
                              "text": line.strip()[:160]}), flush=True)
        path.write_text(original)
    print(json.dumps({"file": args.file, "mutants": len(todo[k::n]), "survived": survived}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
