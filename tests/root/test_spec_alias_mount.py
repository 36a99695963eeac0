"""A second path to the home that no link shows (a bind mount of it
elsewhere, as hosts with /data/home do) is the home: a config mount of it is
refused like `~` (red team of issue 45, round 2). Real mounts, in a private
mount namespace of a child (`unshare -m`), as root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mounts)")

CHILD = r"""
import json, os, subprocess, sys
base, home = sys.argv[1], sys.argv[2]
alias = os.path.join(base, "data-home")
os.mkdir(alias)
subprocess.run(["mount", "--bind", home, alias], check=True)
from leviathd.config.load import parse_blueprint, parse_config
from leviathd.config.merge import resolve
from leviathd.errors import InvalidArgument
from leviathd.identity import UserInfo
from leviathd.sandbox.spec import RunRequest, build_spec_on_host
bp = parse_blueprint('[agent]\nname = "a"\ncommand = ["claude"]\n', "b.toml")
me = UserInfo(name="u", uid=0, gid=0, groups=(), home=home)
out = {}
for name, path in (("home", alias), ("claude", os.path.join(alias, ".claude")),
                   ("other", os.path.join(alias, "notes"))):
    user = parse_config(f'[sandbox]\nmounts = [{{path = "{path}", access = "write"}}]\n', "u")
    eff = resolve(parse_config("", "m"), user, bp, "a").agent
    try:
        build_spec_on_host(eff, me, RunRequest(("claude",), os.path.join(home, "w")), "0123abcd",
                           other_homes=[])
        out[name] = "mounted"
    except InvalidArgument as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""


def test_a_bind_mount_of_the_home_elsewhere_is_the_home() -> None:
    base = Path(tempfile.mkdtemp(prefix="leviath-alias-", dir="/var/tmp"))
    try:
        home = base / "home"
        for d in (home / ".claude", home / "w", home / "notes"):
            d.mkdir(parents=True)
        r = subprocess.run(
            ["unshare", "-m", "--propagation", "private", sys.executable, "-c", CHILD,
             str(base), str(home)],
            capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert "whole home" in got["home"], got
        assert "under another path" in got["claude"], got
        assert got["other"] == "mounted", got
    finally:
        shutil.rmtree(base)
