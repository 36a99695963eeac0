"""The `none` launcher: no fence, only the user's identity, a new session and
the scrubbed environment. Used for `kind = "none"` and for runs that
`on_unavailable = "warn"` sent to the host."""

from __future__ import annotations

import os

from leviathd.sandbox.privileges import drop_to_user
from leviathd.sandbox.spec import SandboxSpec


def run(spec: SandboxSpec) -> int:
    """Exec the command in place: the caller's process becomes the agent, so
    its exit status is the agent's."""
    # A new session: the agent cannot push input into a terminal it came from.
    if os.getpid() != os.getsid(0):
        os.setsid()
    os.chdir(spec.workdir)
    # real_gid is set for a credential command (credential_fence.py), which
    # gets no_new_privs as every command started for a user outside an agent.
    guarded = spec.real_gid is not None
    drop_to_user(spec.uid, spec.gid, spec.groups, no_new_privs=guarded, real_gid=spec.real_gid)
    try:
        os.execvpe(spec.argv[0], list(spec.argv), dict(spec.env))
    except OSError as exc:
        os.write(2, f"leviath: cannot run {spec.argv[0]!r}: {exc.strerror}\n".encode())
        return 127
