"""The credential wrappers on a sandbox's PATH run where /run is noexec.

Debian's initramfs mounts /run `nodev,noexec,nosuid` for the life of the
system, and the agent's folder (/run/leviath/agents/ID, bound at
/run/leviath in its fence) is on it: `gh` on the PATH, the daemon's
two-line wrapper in /run/leviath/bin, failed with "Permission denied" (exit
126) on such a machine, while the test bed's /run allows exec. Here the
bed's /run is remounted noexec first, as Debian has it; the unit's
ExecPaths=/run/leviath gives the daemon, and so every agent it forks, a
/run/leviath that is not. GitHub's gh is the stand-in of
test_cli_credentials (there is no GitHub here)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from journal_wait import config_written
from loop_agent import LoopAgent, lay_out
from test_cli_credentials import BLUEPRINT, CONFIG, FAKE_GH, HASH, TOKEN
from testbed import Testbed

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    old = bed.run(["cat", "/etc/leviath/config.toml"], check=False)
    lay_out(bed, "nxw", "nxbp", BLUEPRINT)
    bed.write_file("/usr/local/bin/gh", FAKE_GH, mode=0o755)
    bed.write_file("/etc/leviath/gh.token", TOKEN + "\n", mode=0o600)
    bed.write_file("/etc/leviath/config.toml", CONFIG)
    bed.run(["mount", "-o", "remount,noexec", "/run"])
    try:
        bed.run(["systemctl", "restart", "leviathd"])
        yield bed
    finally:
        bed.run(["mount", "-o", "remount,exec", "/run"])
        if old.returncode == 0:
            bed.write_file("/etc/leviath/config.toml", old.stdout)
        else:
            bed.run(["rm", "-f", "/etc/leviath/config.toml"])
        bed.run(["rm", "-f", "/etc/leviath/gh.token", "/usr/local/bin/gh"])
        bed.run(["systemctl", "restart", "leviathd"])


def test_the_beds_run_is_noexec_as_debians_is(bed: Testbed) -> None:
    # What the other test stands on: a script on /run outside the daemon's
    # view cannot be executed.
    r = bed.run("printf '#!/bin/sh\\necho ran\\n' > /run/nx-probe && chmod 755 /run/nx-probe "
                "&& /run/nx-probe; rc=$?; rm -f /run/nx-probe; exit $rc", check=False)
    assert r.returncode == 126 and "Permission denied" in r.stderr, r


class OnHost(LoopAgent):
    """Kind none runs on the host: its loop's folder has the host's name."""

    @property
    def dir(self) -> str:
        return f"{self.workdir}/.req/{self.bed.run(['hostname']).stdout.strip()}"


def _gh(bed: Testbed, *, on_host: bool = False) -> tuple[str, str]:
    """`command -v gh; gh api user` in a detached agent of alice's."""
    h = bed.users["alice"].home
    out = bed.run(["lev", "run", "--detach", f"{h}/nxbp"], user="alice",
                  cwd=f"{h}/nxw").stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", out), out
    agent = (OnHost if on_host else LoopAgent)(bed, out, f"{h}/nxw")
    try:
        rc, got, err = agent.call("command -v gh; gh api user")
        assert rc == 0, (got, err)
        assert TOKEN not in got + err
        return got.splitlines()[0], got
    finally:
        bed.run(["lev", "stop", out], user="alice", check=False)


def test_gh_on_the_sandboxs_path_runs_and_gets_the_token_through_the_broker(
        bed: Testbed) -> None:
    where, got = _gh(bed)
    assert where == "/run/leviath/bin/gh", got
    assert "args: api user" in got and f"token: yes {HASH}" in got, got


def test_a_kind_none_agents_gh_runs_from_its_folder_too(bed: Testbed) -> None:
    """No fence: the wrapper is run from /run/leviath/agents/ID/bin on the
    host, in the daemon's mount namespace, which the agent inherits."""
    # Written and waited for: `systemctl reload` only sends SIGHUP, and an
    # agent started before the daemon read the file again is a namespace one.
    config_written(bed, "/etc/leviath/config.toml", CONFIG.replace('"namespace"', '"none"'))
    try:
        where, got = _gh(bed, on_host=True)
    finally:
        config_written(bed, "/etc/leviath/config.toml", CONFIG)
    assert re.fullmatch(r"/run/leviath/agents/[0-9a-f]{8}/bin/gh", where), got
    assert "args: api user" in got and f"token: yes {HASH}" in got, got
