"""scripts/check-bypath refuses by-path chmod/chown/rename/unlink in leviathd/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check-bypath"


def run(tmp_path: Path, code: str, allow: str = "") -> subprocess.CompletedProcess[str]:
    (tmp_path / "leviathd").mkdir(exist_ok=True)
    (tmp_path / "scripts").mkdir(exist_ok=True)
    (tmp_path / "leviathd" / "x.py").write_text(code)
    (tmp_path / "scripts" / "bypath-allow.txt").write_text(allow)
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)],
                          capture_output=True, text=True)


def test_by_path_calls_fail_with_the_rule(tmp_path: Path) -> None:
    code = ("import os, shutil\nfrom os import replace as mv\n"
            "def f(p, q):\n    os.chmod(p, 0o600)\n    mv(p, q)\n    shutil.rmtree(p)\n"
            "    os.lchown(p, 0, 0)\n    p.unlink()\n")
    r = run(tmp_path, code)
    assert r.returncode == 1
    for call in ("os.chmod", "os.replace", "shutil.rmtree", "os.lchown", "Path.unlink"):
        assert f"{call} by path in f" in r.stderr
    assert "Root never acts by path where a user can write" in r.stderr


def test_descriptor_relative_calls_pass(tmp_path: Path) -> None:
    code = ("import os\ndef f(fd, dfd, n):\n    os.chmod(fd, 0o600)\n"
            "    os.chown(n, 0, 0, dir_fd=dfd, follow_symlinks=False)\n"
            "    os.rename(n, n, src_dir_fd=dfd, dst_dir_fd=dfd)\n    os.unlink(n, dir_fd=dfd)\n"
            "    'a'.replace('a', 'b')\n")
    assert run(tmp_path, code).returncode == 0


def test_the_allow_list_needs_a_reason_per_entry(tmp_path: Path) -> None:
    code = "import os\ndef f(p):\n    os.unlink(p)\n"
    assert run(tmp_path, code, "leviathd/x.py f os.unlink  # /var/lib/x is root's 0700\n"
               ).returncode == 0
    r = run(tmp_path, code, "leviathd/x.py f os.unlink\n")
    assert r.returncode == 1 and "why" in r.stderr
