"""enginesock/engineroot.py machine_parts: of the machine's folders, an
agent's engine root gets only the top-level ones named (read-only clones):
a nested path or "/" itself never stands in for one. Needs root (open_tree)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from leviathd.enginesock import engineroot

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to clone mounts")


def test_only_top_level_system_folders_are_taken(tmp_path: Path) -> None:
    parts = engineroot.machine_parts(str(tmp_path), str(tmp_path), [],
                                     ["/usr/lib", "/", "/etc", "//", "/etc/ssl/"])
    try:
        assert sorted(parts.system) == ["etc"]
    finally:
        parts.close()
