"""git's credential helper in an agent's folder works where /run is noexec.

Debian's initramfs mounts /run `nodev,noexec,nosuid` and moves that mount to
the real root, so on a real Debian machine the agent's folder
(/run/leviath/agents/ID, bound at /run/leviath in a fence, which keeps the
flag) is noexec. git ran the helper by its path there and got "Permission
denied" (seen in the Debian 13 VM); the test bed's /run allows exec, so only
a noexec mount of our own shows it here. The helper is the shape our
script has (`#!/bin/sh`), answering a fixed password instead of asking the
broker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

from leviathd.creds.service import helper_command

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount")

HELPER = '#!/bin/sh\n[ "$1" = get ] && echo username=agent && echo password=from-the-helper\n'


def _fill(setting_for: str) -> subprocess.CompletedProcess[str]:
    """git credential fill, in a mount namespace of its own, with the helper
    on a noexec tmpfs and git's setting made from `setting_for(path)`."""
    assert shutil.which("git") and shutil.which("unshare")
    with tempfile.TemporaryDirectory() as d:
        script = f"""
set -e
mount -t tmpfs -o noexec,nosuid,nodev tmpfs {d}
printf '%s' '{HELPER}' > {d}/git-credential-leviath
chmod 755 {d}/git-credential-leviath
printf 'protocol=https\\nhost=git.test\\n\\n' | GIT_TERMINAL_PROMPT=0 HOME={d} \
    git -c credential.helper= -c "credential.helper=$(printf '%s' "$SETTING" | sed "s#@@#{d}#")" \
    credential fill
"""
        return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                              env={**os.environ, "SETTING": setting_for},
                              capture_output=True, text=True, timeout=60)


def test_the_helper_setting_runs_our_script_from_a_noexec_folder() -> None:
    r = _fill(helper_command("@@/git-credential-leviath"))
    assert r.returncode == 0, r.stderr
    assert "password=from-the-helper" in r.stdout, (r.stdout, r.stderr)


def test_the_bare_path_is_refused_there_which_is_what_the_setting_avoids() -> None:
    # The old setting, for contrast: if this ever passes, the mount in this
    # test is not noexec and the test above proves nothing.
    r = _fill("@@/git-credential-leviath")
    assert "password=from-the-helper" not in r.stdout, r.stdout
    assert "Permission denied" in r.stderr, r.stderr
