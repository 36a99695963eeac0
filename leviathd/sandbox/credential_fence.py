"""The fence a credential command runs in, computed from its agent's spec.

A credential command holds a secret the agent must never see, so nothing it
reads may be the agent's to write: a program that takes configuration from
its working folder or home (git's `.git/config`, npm's `.npmrc`, a Makefile)
would otherwise run what the agent planted, with the secret in reach
(issue 21). So the fence keeps only the read-only system of the agent's
fence, gives the command an empty home of its own (a tmpfs, also its working
folder) and an empty /tmp, and shows the workdir only when the credential
says `workdir = "ro"`, read-only. It is a new fence: its own PID namespace
(the agent cannot see or ptrace it), its own mount table. It has the host's
network whatever the agent's setting: talking to a service with the secret
is what a credential command is for, and the gate decided that already.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from leviathd.domain.sandbox import SandboxKind
from leviathd.errors import Unavailable

CredentialWorkdir = Literal["none", "ro"]
CREDENTIAL_WORKDIRS: tuple[str, ...] = ("none", "ro")

# Parts of the agent's table that only ever show the read-only system.
_KEPT = ("system", "system link", "fresh /proc", "minimal /dev")
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
NOGROUP = 65534


def credential_spec(
    agent_spec: Mapping[str, Any],
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    workdir: CredentialWorkdir,
    private_dir: str = "",
) -> dict[str, Any]:
    """The spec (as a dict, for `SandboxSpec.from_dict`) of one credential
    command's fence. `env` is the whole environment besides HOME, USER and
    LOGNAME: nothing of the agent's is inherited.

    An agent of `kind = "none"` has no fence to derive one from, and neither
    does its command get one: it runs as the agent does, on the host, but
    with `private_dir` (an empty folder of root's, which no user can write)
    as its home and working folder, so no file the agent planted is read as
    its configuration."""
    kind = agent_spec.get("kind")
    if workdir not in CREDENTIAL_WORKDIRS:
        raise Unavailable(f"credential workdir {workdir!r} is not one of none, ro")
    gid = int(agent_spec["gid"])
    # exec keeps a process whose real and effective gids differ out of reach
    # of its own user's /proc and ptrace (broker/tools.py `_guarded`).
    real_gid = NOGROUP if gid != NOGROUP else NOGROUP - 1
    if kind == SandboxKind.NONE and private_dir:
        spec = dict(agent_spec)
        spec.update(argv=list(argv), workdir=private_dir, real_gid=real_gid, notes=[],
                    env={**env, "HOME": private_dir, "USER": str(agent_spec["user"]),
                         "LOGNAME": str(agent_spec["user"])})
        return spec
    if kind != SandboxKind.NAMESPACE:
        raise Unavailable(
            f"credential commands run in a namespace fence of their own, or beside a "
            f"kind = \"none\" agent; this agent's sandbox is {kind!r}"
        )
    home = str(agent_spec["home"])
    mounts: list[dict[str, Any]] = []
    for m in agent_spec["mounts"]:
        why = str(m.get("why", ""))
        if why in _KEPT:
            mounts.append(dict(m))
    # tmpfs mounts are the user's, 0700 and empty (sandbox/namespace.py).
    mounts.append({"kind": "tmpfs", "target": home, "why": "credential home (private)"})
    mounts.append({"kind": "tmpfs", "target": "/tmp", "why": "credential tmp (private)"})
    if workdir == "ro":
        for m in agent_spec["mounts"]:
            why = str(m.get("why", ""))
            if not why.startswith(("workdir", "worktree git")):
                continue
            # A throwaway workdir is an overlay: show its lower (host) folder,
            # never the layer the agent writes.
            mounts.append({"kind": "bind", "target": m["target"], "source": m["source"],
                           "readonly": True, "why": why + " (read-only for a credential)"})
    # Hidden paths inside what is shown stay covered, as in the agent's fence.
    for m in agent_spec["mounts"]:
        if m.get("kind") == "mask":
            mounts.append(dict(m))
    full_env = {**env, "HOME": home, "USER": str(agent_spec["user"]),
                "LOGNAME": str(agent_spec["user"])}
    namespaces = sorted(set(agent_spec.get("namespaces", ())) - {"net"})
    spec = dict(agent_spec)
    spec.update(
        real_gid=real_gid,
        argv=list(argv), env=full_env, workdir=home, mounts=mounts, network=True,
        namespaces=namespaces, notes=[],
        hostname=(str(agent_spec.get("hostname", "leviath")) + "-cred")[-64:],
        # It binds nothing of the scratch (its home and /tmp are tmpfs of
        # its own): the launcher's scratch for it is a tmpfs, not an ext4
        # made per call (sandbox/loopfs.py).
        scratch_fs="tmpfs",
    )
    return spec
