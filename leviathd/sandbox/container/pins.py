"""The container kind's image, pinned: `[sandbox] image` names an image by a
tag, and a tag is whatever anyone who can write the engine's storage last
made it (issue 29: an agent retagged a trojan over the machine's image and
the next user's container-kind agent ran it). So the daemon resolves the
name to the image's ID when the configuration loads (and on every reload),
off the event loop, and the container is run from that ID: a later retag in
any storage changes nothing users run until root reloads.

A name that was not in storage at load (an image imported afterwards, or a
user's own choice where the machine has no [sandbox]) is pinned at its first
start, and stays pinned until the next reload.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re

from leviathd.sandbox import engine as engines
from leviathd.sandbox.container.availability import _engine

_ID = re.compile(r"^(sha256:)?[0-9a-f]{64}\Z")
_pins: dict[tuple[str, str], str] = {}  # (configured engine, image name) -> image ID
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="image-pins")
_pending: concurrent.futures.Future[None] | None = None


def resolve(configured: str, image: str) -> str | None:
    """The image's ID in the engine's storage, or None (no such image, no engine)."""
    try:
        eng = _engine(configured)
    except engines.EngineUnavailable:
        return None
    try:
        r = engines._run([*eng.base(), "image", "inspect", "--format", "{{.Id}}", image])
    except (OSError, TimeoutError):
        return None
    found = r.stdout.strip().removeprefix("sha256:")
    if r.returncode != 0 or not _ID.match(found):
        return None
    return found


def _refresh(wanted: set[tuple[str, str]]) -> None:
    fresh = {key: got for key in wanted if (got := resolve(*key)) is not None}
    _pins.clear()
    _pins.update(fresh)


def reload(wanted: set[tuple[str, str]]) -> None:
    """Forget every pin and resolve `wanted` (engine, image) pairs again, in a
    worker thread: callable from the event loop (config load and reload)."""
    global _pending
    _pins.clear()
    _pending = _pool.submit(_refresh, set(wanted))


async def pinned(configured: str, image: str) -> str:
    """The ID to run for `image`: its pin, made now if it has none. The name
    itself only when the engine does not know it (the run then fails with
    the engine's own message, as before)."""
    pending = _pending
    if pending is not None and not pending.done():
        await asyncio.wrap_future(pending)
    key = (configured, image)
    got = _pins.get(key)
    if got is None:
        got = await asyncio.to_thread(resolve, configured, image)
        if got is None:
            return image
        got = _pins.setdefault(key, got)
    return got
