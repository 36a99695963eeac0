"""Can the container kind be built here: the configured engine found and probed,
the image present (both remembered for a short while)."""

from __future__ import annotations

import os
import time
from typing import Any

from leviathd.sandbox import engine as engines

_PROBE_TTL = 30.0
_engine_cache: dict[str, tuple[float, engines.DetectedEngine | str]] = {}
# (engine, its path, image) -> when the image was last seen in its storage.
_image_seen: dict[tuple[str, str, str], float] = {}


def _engine(configured: str) -> engines.DetectedEngine:
    """The detected engine, cached for a short while (podman info is ~0.1 s)."""
    now = time.monotonic()
    hit = _engine_cache.get(configured)
    if hit is None or now - hit[0] > _PROBE_TTL:
        try:
            value: engines.DetectedEngine | str = engines.detect(configured)
        except engines.EngineUnavailable as exc:
            value = str(exc)
        except (OSError, TimeoutError) as exc:
            value = f"the engine did not answer: {exc}"
        hit = (now, value)
        _engine_cache[configured] = hit
    if isinstance(hit[1], str):
        raise engines.EngineUnavailable(hit[1])
    return hit[1]


def probe(effective: Any) -> str | None:
    """Why the container kind cannot be built here for these settings, or None.

    Checks, in order: root, an engine that answers (and a runtime it can use),
    an image named by the configuration and present in local storage (the
    daemon never pulls: that would reach a registry, as root, at spawn)."""
    if os.geteuid() != 0:
        return "the container kind needs the daemon to run as root"
    try:
        eng = _engine(str(effective.engine))
    except engines.EngineUnavailable as exc:
        return str(exc)
    image = effective.image
    if not image:
        return "no image is configured ([sandbox] image)"
    seen = (eng.name, eng.path, str(image))
    if time.monotonic() - _image_seen.get(seen, -_PROBE_TTL) < _PROBE_TTL:
        # Seen there a moment ago: one engine call (a tenth of a second) less
        # per start. Runs never pull (--pull=never), so an image removed
        # meanwhile fails that start with the engine's message.
        return None
    try:
        present = engines.image_present(eng, image)
    except (OSError, TimeoutError) as exc:
        return f"{eng.name} did not answer: {exc}"
    if not present:
        _image_seen.pop(seen, None)
        return f"image {image} is not in {eng.name}'s local storage (pull or import it as root)"
    _image_seen[seen] = time.monotonic()
    return None
