"""Kind none (sandbox/none.py run): no fence, but the command runs with only
the user's ids and in a session of its own, so it cannot push input into a
terminal it came from. Needs root (to become the user)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from leviathd.sandbox import none
from leviathd.sandbox.spec import SandboxSpec

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become a user")

NOBODY = 65534
PROBE = ("import json, os; print(json.dumps({'ids': [os.getresuid(), os.getresgid()], "
         "'groups': os.getgroups(), 'leader': os.getsid(0) == os.getpid()}))")


def _spec() -> SandboxSpec:
    return SandboxSpec(
        kind="none", argv=(sys.executable, "-I", "-c", PROBE), env={"PATH": "/usr/bin:/bin"},
        workdir="/", workdir_mode="rw", uid=NOBODY, gid=NOBODY, groups=(), user="nobody",
        home="/", sandbox_home="/", mounts=(), hidden=(), namespaces=(), network=True,
        scratch="/", hostname="h", execution_id="0123abcd")


def test_the_command_has_only_the_users_ids_and_a_session_of_its_own() -> None:
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child becomes the command
        try:
            os.close(rfd)
            os.dup2(wfd, 1)
            # Not a session leader (the test's own session), as the daemon's fork is not.
            os._exit(none.run(_spec()))
        finally:
            os._exit(126)
    os.close(wfd)
    out = b""
    while chunk := os.read(rfd, 4096):
        out += chunk
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    seen = json.loads(out)
    assert seen["ids"] == [[NOBODY] * 3, [NOBODY] * 3]
    assert seen["groups"] == []
    assert seen["leader"] is True
