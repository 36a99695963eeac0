"""Apply each mutant of mutants.toml to a throwaway copy of the checkout and
run its tests there; a mutant must make them fail (see scripts/mutants)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

PYTEST = "/opt/leviath-dev/venv/bin/pytest"


def copy_checkout(src: Path, dest: Path) -> None:
    files = subprocess.run(["git", "-C", str(src), "ls-files", "-co", "--exclude-standard"],
                           check=True, capture_output=True, text=True).stdout.split()
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if (src / rel).is_file():
            shutil.copy2(src / rel, target)


def selected(m: dict[str, object], names: list[str], files: list[str]) -> bool:
    """No selector: every mutant. Otherwise those whose name contains one of
    `names`, and those of a module in `files` (a file's path, or a folder:
    every module under it), e.g. `--file leviathd/proxy/azure.py`."""
    if not names and not files:
        return True
    path = str(m["file"])
    return (any(n in str(m["name"]) for n in names)
            or any(path == f.rstrip("/") or path.startswith(f.rstrip("/") + "/")
                   for f in files))


def main() -> int:
    checkout = Path(sys.argv[1])
    names: list[str] = []
    files: list[str] = []
    args = iter(sys.argv[2:])
    for a in args:
        if a == "--file":
            files.append(next(args, ""))
        elif a.startswith("--file="):
            files.append(a.split("=", 1)[1])
        else:
            names.append(a)
    table = tomllib.loads((checkout / "tests/mutants/mutants.toml").read_text())["mutant"]
    bad: list[str] = []
    ran = 0
    for m in table:
        if not selected(m, names, files):
            continue
        ran += 1
        with tempfile.TemporaryDirectory(prefix="leviath-mutant.", dir="/var/tmp") as tmp:
            copy = Path(tmp)
            os.chmod(copy, 0o755)  # the bed's test users read the copy
            copy_checkout(checkout, copy)
            path = copy / m["file"]
            text = path.read_text()
            if text.count(m["find"]) != 1:
                print(f"STALE     {m['name']}: its text is not found once in {m['file']}")
                bad.append(m["name"])
                continue
            path.write_text(text.replace(m["find"], m["replace"]))
            r = subprocess.run([PYTEST, "-q", "-x", "-p", "no:cacheprovider", *m["tests"]],
                               cwd=copy, capture_output=True, text=True)
            if r.returncode == 1:
                print(f"killed    {m['name']}")
            else:
                tail = "\n".join(r.stdout.splitlines()[-3:])
                print(f"SURVIVED  {m['name']} (pytest exit {r.returncode})\n{tail}")
                bad.append(m["name"])
    if not ran:
        print("no mutant matches", " ".join(sys.argv[2:]))
        return 1
    print(f"{len(bad)} of {ran} mutant(s) not killed" if bad else f"all {ran} mutant(s) killed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
