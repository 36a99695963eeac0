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
from dataclasses import replace
from typing import Literal

from leviathd.domain.sandbox import SandboxKind
from leviathd.errors import Unavailable
from leviathd.sandbox.spec import Mount, MountRole, SandboxSpec

CredentialWorkdir = Literal["none", "ro"]
CREDENTIAL_WORKDIRS: tuple[str, ...] = ("none", "ro")

# What `workdir = "ro"` shows.
_SHOWN = (MountRole.WORKDIR, MountRole.WORKTREE_GIT)
NOGROUP = 65534


def credential_spec(
    agent_spec: SandboxSpec,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    workdir: CredentialWorkdir,
    private_dir: str = "",
) -> SandboxSpec:
    """The spec of one credential command's fence, derived from its agent's
    recorded one. `env` is the whole environment besides HOME, USER and
    LOGNAME: nothing of the agent's is inherited.

    An agent of `kind = "none"` has no fence to derive one from, and neither
    does its command get one: it runs as the agent does, on the host, but
    with `private_dir` (an empty folder of root's, which no user can write)
    as its home and working folder, so no file the agent planted is read as
    its configuration."""
    kind = agent_spec.kind
    if workdir not in CREDENTIAL_WORKDIRS:
        raise Unavailable(f"credential workdir {workdir!r} is not one of none, ro")
    user = agent_spec.user
    # exec keeps a process whose real and effective gids differ out of reach
    # of its own user's /proc and ptrace (broker/credentials.py `_guarded`).
    real_gid = NOGROUP if agent_spec.gid != NOGROUP else NOGROUP - 1
    if kind == SandboxKind.NONE and private_dir:
        return replace(agent_spec, argv=tuple(argv), workdir=private_dir, real_gid=real_gid,
                       notes=(), env={**env, "HOME": private_dir, "USER": user, "LOGNAME": user})
    if kind != SandboxKind.NAMESPACE:
        raise Unavailable(
            f"credential commands run in a namespace fence of their own, or beside a "
            f"kind = \"none\" agent; this agent's sandbox is {str(kind)!r}"
        )
    home = agent_spec.home
    # Parts of the agent's table that only ever show the read-only system.
    mounts = [m for m in agent_spec.mounts if m.role == MountRole.SYSTEM]
    # tmpfs mounts are the user's, 0700 and empty (sandbox/namespace/root.py).
    mounts.append(Mount("tmpfs", home, why="credential home (private)"))
    mounts.append(Mount("tmpfs", "/tmp", why="credential tmp (private)"))
    if workdir == "ro":
        # A throwaway workdir is an overlay: show its lower (host) folder,
        # never the layer the agent writes.
        mounts += [Mount("bind", m.target, m.source, readonly=True, role=m.role,
                         why=m.why + " (read-only for a credential)")
                   for m in agent_spec.mounts if m.role in _SHOWN]
    # Hidden paths inside what is shown stay covered, as in the agent's fence.
    mounts += [m for m in agent_spec.mounts if m.kind == "mask"]
    return replace(
        agent_spec,
        real_gid=real_gid,
        argv=tuple(argv), env={**env, "HOME": home, "USER": user, "LOGNAME": user},
        workdir=home, mounts=tuple(mounts), network=True,
        namespaces=tuple(sorted(set(agent_spec.namespaces) - {"net"})), notes=(),
        hostname=(agent_spec.hostname + "-cred")[-64:],
        # It binds nothing of the scratch (its home and /tmp are tmpfs of
        # its own): the launcher's scratch for it is a tmpfs, not an ext4
        # made per call (sandbox/loopfs.py).
        scratch_fs="tmpfs",
    )
