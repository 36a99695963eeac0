"""`lev` as the packages install it: `python3 -IS`, its own site folder on the
path, `site` run only for a command that needs a library from elsewhere
(packaging/slim-entry-point.sh, leviathd/cli/lazysite.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SITEDIR = "/usr/lib/python3/dist-packages"
TEMPLATE = """#!{python} -sP
# -*- coding: utf-8 -*-
import re
import sys
from leviathd.cli.main import main
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(main())
"""


def _installed(tmp_path: Path) -> Path:
    """A package root as a build leaves it: the installer's wrapper, the
    package in the site folder; then slimmed."""
    root = tmp_path / "root"
    site = root / SITEDIR.lstrip("/")
    site.mkdir(parents=True)
    (site / "leviathd").symlink_to(REPO / "leviathd")
    lev = root / "usr/bin/lev"
    lev.parent.mkdir(parents=True)
    lev.write_text(TEMPLATE.format(python=sys.executable))
    subprocess.run(["sh", str(REPO / "packaging/slim-entry-point.sh"), str(lev),
                    "leviathd.cli.main", SITEDIR], check=True)  # fmt: skip
    text = lev.read_text()
    assert f"sys.path.append('{SITEDIR}')" in text, text
    # Run from where it lies, not from / where the package will put it.
    lev.write_text(text.replace(repr(SITEDIR), repr(str(site))))
    return lev


def test_the_slim_wrapper_starts_lev_without_site_and_from_its_own_folder(
    tmp_path: Path,
) -> None:
    lev = _installed(tmp_path)
    text = lev.read_text()
    assert text.splitlines()[0] == f"#!{sys.executable} -IS", text
    assert "import re" not in text
    r = subprocess.run([sys.executable, "-IS", "-X", "importtime", str(lev), "ps"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    names = {line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines()
             if line.startswith("import time:") and line.count("|") == 2}
    assert "leviathd.cli.main" in names, r.stderr[-2000:]
    assert "site" not in names, sorted(names)


def test_a_command_that_needs_a_library_from_the_site_folders_still_finds_it(
    tmp_path: Path,
) -> None:
    # `lev validate` needs pydantic, which lives in the interpreter's site
    # folders, not beside leviathd here: only `site`, run on demand, finds it.
    lev = _installed(tmp_path)
    (tmp_path / "bp").mkdir()
    (tmp_path / "bp/blueprint.toml").write_text('name = "x"\ncommand = ["true"]\n')
    r = subprocess.run([str(lev), "validate", str(tmp_path / "bp")], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert "ModuleNotFoundError" not in r.stderr, r.stderr[-2000:]
    assert "No module named" not in r.stderr, r.stderr[-2000:]
    assert r.returncode in (0, 1, 2), (r.returncode, r.stdout, r.stderr)
    assert r.stdout or r.stderr


def test_a_broken_package_root_is_refused_by_the_slimming(tmp_path: Path) -> None:
    lev = tmp_path / "root/usr/bin/lev"
    lev.parent.mkdir(parents=True)
    lev.write_text(TEMPLATE.format(python=sys.executable))
    r = subprocess.run(["sh", str(REPO / "packaging/slim-entry-point.sh"), str(lev),
                        "leviathd.cli.main", SITEDIR], capture_output=True, text=True)  # fmt: skip
    assert r.returncode != 0 and "not installed" in r.stderr, r.stderr
    assert lev.read_text() == TEMPLATE.format(python=sys.executable)
