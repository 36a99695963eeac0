"""Teardown: an agent's containers removed when it ends, and every agent's that
is no longer alive swept at start; another daemon's are never touched."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from typing import Any

from leviathd import fsat
from leviathd.domain.sandbox import SandboxKind
from leviathd.paths import runtime_dir
from leviathd.sandbox import engine as engines
from leviathd.sandbox.container.availability import _engine
from leviathd.sandbox.container.records import _record_path
from leviathd.sandbox.container.settings import (
    _IDENTITY_FILES,
    LABEL_AGENT,
    LABEL_DAEMON,
    daemon_instance,
)
from leviathd.sandbox.container.start import _engine_cmd, unpin


def _present_engines() -> list[engines.DetectedEngine]:
    """Every engine binary here, for cleanup (which needs no image)."""
    out: list[engines.DetectedEngine] = []
    for name in ("podman", "docker"):
        path = engines.find_binary(name)
        if path is None:
            continue
        try:
            out.append(_engine(name))
        except engines.EngineUnavailable:
            if name == "podman":
                out.append(engines.DetectedEngine("podman", path, None))
    return out


async def _list(eng: engines.DetectedEngine, *filters: str) -> list[tuple[str, dict[str, str]]]:
    """(name, labels) of this daemon's containers matching the label filters."""
    argv = [*eng.base(), "ps", "-a", "--filter", f"label={LABEL_DAEMON}={daemon_instance()}"]
    for f in filters:
        argv += ["--filter", f"label={f}"]
    if eng.name == "podman":
        rc, out, _ = await _engine_cmd([*argv, "--format", "json"])
        if rc != 0:
            return []
        rows = json.loads(out or "[]")
        return [(r["Names"][0], dict(r.get("Labels") or {})) for r in rows if r.get("Names")]
    rc, out, _ = await _engine_cmd([*argv, "--format", "{{json .}}"])
    if rc != 0:
        return []
    result = []
    for line in out.splitlines():
        row = json.loads(line)
        pairs = (kv.partition("=") for kv in str(row.get("Labels", "")).split(",") if kv)
        result.append((str(row["Names"]).split(",")[0], {k: v for k, _, v in pairs}))
    return result


async def _remove(eng: engines.DetectedEngine, names: list[str]) -> None:
    if not names:
        return
    rm = [*eng.base(), "rm", "-f"] + (["-t", "0"] if eng.name == "podman" else [])
    await _engine_cmd([*rm, *names])
    for name in names:
        with contextlib.suppress(OSError):
            dfd = fsat.open_dir(os.path.dirname(_record_path(name)))
            try:
                fsat.unlink_at(dfd, f"{name}.json")
            finally:
                os.close(dfd)


async def teardown(agent_id: str) -> list[str]:
    """Remove every container of this daemon labelled with `agent_id`; returns
    their names."""
    removed: list[str] = []
    for eng in _present_engines():
        names = [n for n, _ in await _list(eng, f"{LABEL_AGENT}={agent_id}")]
        await _remove(eng, names)
        removed += names
    unpin(agent_id)
    _remove_identity(agent_id)
    return removed


def _remove_identity(agent_id: str) -> None:
    # File by file, never a tree removal: nothing here may lead elsewhere.
    with contextlib.suppress(OSError, ValueError):
        containers = fsat.open_dir(os.path.join(runtime_dir(), "containers"))
        try:
            folder = fsat.open_dir_at(containers, agent_id)
            try:
                for name in _IDENTITY_FILES:
                    fsat.unlink_at(folder, name)
            finally:
                os.close(folder)
            fsat.rmdir_at(containers, agent_id)
        finally:
            os.close(containers)


async def end_hook(rec: Any) -> None:
    """Run first at every agent's end (agents/ending.py): an agent with a
    container step (its record's sandbox is "container" or, with stages,
    e.g. "namespace+container") loses its containers when it ends, however
    it ends."""
    if SandboxKind.CONTAINER in str(rec.sandbox).split("+"):
        await teardown(str(rec.id))


async def sweep(live_ids: Iterable[str]) -> list[str]:
    """At daemon start: remove this daemon's containers whose agent is not
    alive (it ended while the daemon was away). Returns their names."""
    live = set(live_ids)
    removed: list[str] = []
    for eng in _present_engines():
        names = [n for n, lab in await _list(eng) if lab.get(LABEL_AGENT) not in live]
        await _remove(eng, names)
        removed += names
    for sub, forget in (("pinned", unpin), ("", _remove_identity)):
        with contextlib.suppress(OSError):
            for entry in os.scandir(os.path.join(runtime_dir(), "containers", sub)):
                if entry.is_dir(follow_symlinks=False) and entry.name not in live | {"pinned"}:
                    forget(entry.name)
    return removed
