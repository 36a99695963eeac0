"""A credential command's fence, as the daemon builds it for the broker's
runner (gate/service.py `run_credential`, which runs it in the agent's scope
as it runs the `shell` tool): the fence computed from the agent's recorded
spec (creds/fence.py) and, for a `kind = "none"` agent, which has no fence
of its own to borrow a private home from, an empty home of root's."""

from __future__ import annotations

import os

from leviathd import fsat
from leviathd.broker.credentials import CredentialRequest
from leviathd.creds.fence import credential_spec
from leviathd.domain.sandbox import SandboxKind
from leviathd.errors import AccessDenied
from leviathd.sandbox.spec import SandboxSpec

CREDENTIAL_HOME = "credential-home"


def command_spec(agent_spec: SandboxSpec, req: CredentialRequest, agent_dir: str) -> SandboxSpec:
    """The spec `req` runs with: in a fence of its own, never in, nor reading
    from, a folder the agent can write. `agent_dir` is the agent's own
    root-owned folder (gate/service.py `agent_dir`)."""
    private = ""
    if agent_spec.kind == SandboxKind.NONE:
        private = credential_home(agent_dir)
    return credential_spec(agent_spec, req.argv, req.env, workdir=req.workdir,
                           private_dir=private)


def credential_home(agent_dir: str) -> str:
    """An empty folder of root's, 0755, in the agent's own root-owned folder:
    the home and working folder of a `kind = "none"` agent's credential
    commands, where nobody but root can put anything."""
    afd = fsat.open_dir(agent_dir)
    try:
        if os.fstat(afd).st_uid != os.geteuid():
            raise AccessDenied(f"{agent_dir} is not owned by the daemon's user")
        os.fchmod(afd, 0o750)
        fsat.empty_subdir_at(afd, CREDENTIAL_HOME, create_mode=0o755, uid=os.geteuid(),
                             gid=os.getegid(), mode=0o755)
    finally:
        os.close(afd)
    return os.path.join(agent_dir, CREDENTIAL_HOME)
