"""Each user's image store: what a user's agents pulled, loaded or built,
kept for the same user's next agents (issue 49, item 4).

`<state>/image-store/<uid>/` (root's folder 0711, the user's 0700 in it)
holds a podman storage of the user's own, written only by the daemon's
runner (enginesock/imagestore_exec.py, as the user, in a root with nothing
else of the user's):

- at an agent's end, once its scope is empty and before its engine storage
  is removed, every named image of that storage is copied into the store,
  then the store's oldest images are removed until the rest fit in
  `[sandbox.containers] image_store_max`;
- at an agent's start, before its engine runs, every image of the store is
  copied into the agent's own (empty) storage.

So an agent runs its own copies: nothing it does (rmi, tag, a build over a
name) reaches the store or another running agent until it ends, and then
only by adding or replacing names, which is what keeping images means. Why
copies and not the store given to each engine read-only (c/storage's
additional image stores): the vfs driver of podman 4.3 (Debian 12; what
rootless podman falls back to where overlay cannot mount) has none.

Each user's store is their own folder, copied only to and from that user's
agents: another user's agent never sees it. The runs for one user wait for
each other (one lock per user in the daemon).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from typing import Any

from leviathd import fsat
from leviathd.enginesock import rootless
from leviathd.identity import UserInfo
from leviathd.sandbox.spec import SYSTEM_DIRS, SYSTEM_LINK_DIRS

STORE = "image-store"
MAX_RESULT = 1 << 20
RUN_TIMEOUT = 3600.0

_LOCKS: dict[int, asyncio.Lock] = {}


def store_name(uid: int) -> str:
    """One store per user, named by uid (a name may be reused)."""
    return str(uid)


def store_dir(state_dir: str, uid: int) -> str:
    return os.path.join(state_dir, STORE, store_name(uid))


def _lock(uid: int) -> asyncio.Lock:
    return _LOCKS.setdefault(uid, asyncio.Lock())


def prepare(state_dir: str, user: UserInfo) -> str:
    """The user's store folder (made, or taken over, by descriptor)."""
    rootless._user_folder(os.path.join(state_dir, STORE), store_name(user.uid), user)
    return store_dir(state_dir, user.uid)


def orders(mode: str, agent_id: str, state_dir: str, user: UserInfo, podman: str,
           max_bytes: int) -> dict[str, Any]:
    return {"mode": mode, "uid": user.uid, "gid": user.gid, "groups": list(user.groups),
            "user": user.name, "podman": podman, "path": rootless.ENGINE_PATH,
            "agent_flags": rootless.storage_flags(),
            "storage": rootless.places(agent_id, state_dir).storage,
            "store": store_dir(state_dir, user.uid), "max": max_bytes,
            "system": list(SYSTEM_DIRS + SYSTEM_LINK_DIRS)}


async def _run(order: dict[str, Any]) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "leviathd.enginesock.imagestore_exec",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True,
        env={"PATH": rootless.ENGINE_PATH})
    try:
        out, err = await asyncio.wait_for(
            proc.communicate(json.dumps(order).encode() + b"\n"), RUN_TIMEOUT)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    said = err.decode(errors="replace").strip()[-2000:]
    if proc.returncode != 0:
        raise OSError(f"the image store's runner failed: {said or proc.returncode}")
    result: dict[str, Any] = json.loads(out[:MAX_RESULT] or b"{}")
    if said:
        result["said"] = said
    return result


async def save(agent_id: str, state_dir: str, user: UserInfo, max_bytes: int) -> dict[str, Any]:
    """The ended agent's named images into its user's store, then the store
    pruned to `max_bytes`. Only once nothing of the agent's engine runs."""
    podman = await asyncio.to_thread(rootless.preflight, user)
    async with _lock(user.uid):
        await asyncio.to_thread(prepare, state_dir, user)
        return await _run(orders("save", agent_id, state_dir, user, podman, max_bytes))


async def seed(agent_id: str, state_dir: str, user: UserInfo) -> dict[str, Any]:
    """The user's stored images into the agent's new engine storage (made
    by rootless.prepare), before its engine starts. Nothing to do for a
    user with no store yet."""
    podman = await asyncio.to_thread(rootless.preflight, user)
    async with _lock(user.uid):
        if not await asyncio.to_thread(_has_store, state_dir, user.uid):
            return {"seeded": []}
        return await _run(orders("seed", agent_id, state_dir, user, podman, 0))


def _has_store(state_dir: str, uid: int) -> bool:
    """Whether the user's store folder exists (root's own parent: an lstat
    of an entry in it)."""
    try:
        pfd = fsat.open_dir(os.path.join(state_dir, STORE))
    except FileNotFoundError:
        return False
    try:
        return fsat.lstat_at(pfd, store_name(uid)) is not None
    finally:
        os.close(pfd)
