"""Which host folders an agent may bind into a container: those its sandbox
shows, at no more access.

The agent names a path as it sees it. Its sandbox is a table of mounts
(leviathd/sandbox/spec.py): the deepest bind whose target holds the path
gives the host path; links are then resolved on the host, and the result must
again lie in a bind of the sandbox (a link in the worktree to ~/.ssh is
refused), outside every hidden path, and hold no hidden path or mask (binding
a parent would show what the sandbox covers). Read-only anywhere on the way
means read-only.

`resolve` touches the file system (realpath, as root): callers run it off the
event loop. The engine resolves the path again when it mounts it; the source
it gets is the resolved path, so a link swapped in later at the last
component does not lead elsewhere, but a folder on the way that the agent
replaces by a link between the check and the mount does (docs/containers.md).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass

from leviathd.sandbox.spec import SandboxSpec


class BindRefused(Exception):
    """The reason, for the agent (without the 'leviathd:' prefix)."""


def _inside(path: str, base: str) -> bool:
    return path == base or base == "/" or path.startswith(base.rstrip("/") + "/")


@dataclass(frozen=True)
class _Entry:
    target: str
    kind: str
    source: str
    readonly: bool


@dataclass(frozen=True)
class View:
    entries: tuple[_Entry, ...]
    hidden: tuple[str, ...]
    masks: tuple[str, ...]  # host paths of what the sandbox covers inside its binds
    refused: tuple[str, ...]  # host paths never bound (the agent's own sockets, engines)

    @classmethod
    def from_spec(cls, spec: SandboxSpec, refused: tuple[str, ...] = ()) -> View:
        entries = tuple(
            _Entry(posixpath.normpath(m.target), m.kind, m.source, m.readonly)
            for m in spec.mounts if m.kind != "mask"
        )
        view = cls(entries, tuple(spec.hidden), (), refused)
        masks: list[str] = []
        for m in spec.mounts:
            if m.kind != "mask":
                continue
            entry = view._entry_for(posixpath.normpath(m.target))
            if entry is not None and entry.kind == "bind":
                masks.append(_join(entry.source, _rest(m.target, entry.target)))
        return cls(entries, tuple(spec.hidden), tuple(masks), refused)

    def _entry_for(self, path: str) -> _Entry | None:
        best: _Entry | None = None
        for e in self.entries:  # table order: a later mount lies over an earlier one
            if _inside(path, e.target) and (best is None or len(e.target) >= len(best.target)):
                best = e
        return best

    def _source_entry(self, real: str) -> _Entry | None:
        best: _Entry | None = None
        for e in self.entries:
            if e.kind == "bind" and _inside(real, e.source) and (
                best is None or len(e.source) > len(best.source)
                or (len(e.source) == len(best.source) and e.readonly)
            ):
                best = e
        return best

    def resolve(self, path: str, writable: bool) -> tuple[str, bool]:
        """The host path to give the engine for the agent's `path`, and whether
        it must be read-only (True when the sandbox shows it read-only, or
        `writable` is False). Raises BindRefused."""
        if not path.startswith("/"):
            raise BindRefused(f"bind source {path[:200]!r} is not an absolute path")
        norm = posixpath.normpath(path)
        for h in self.hidden:
            if _inside(norm, h):
                raise BindRefused(f"bind of {norm[:200]} is refused: the sandbox hides {h}")
        entry = self._entry_for(norm)
        if entry is None or entry.kind != "bind":
            raise BindRefused(f"bind of {norm[:200]} is refused: it is not a folder of the "
                              "host that the agent's sandbox shows")
        host = _join(entry.source, _rest(norm, entry.target))
        real = os.path.realpath(host)
        held = self._source_entry(real)
        for h in self.refused:
            if _inside(real, h) or _inside(h, real):
                raise BindRefused(f"bind of {norm[:200]} is refused: it leads to {real[:200]}, "
                                  "the agent's own sockets or the engine's")
        for h in self.hidden:
            # A bind the sandbox makes inside a hidden folder (its scratch, its
            # own socket folder) is shown on purpose; anything else there is not.
            shown = held is not None and _inside(held.source, h)
            if (_inside(real, h) and not shown) or (_inside(h, real) and h != real):
                raise BindRefused(f"bind of {norm[:200]} is refused: it leads to {real[:200]}, "
                                  f"and the sandbox hides {h}")
        if held is None:
            raise BindRefused(f"bind of {norm[:200]} is refused: it leads to {real[:200]}, "
                              "which the agent's sandbox does not show")
        for m in self.masks:
            if _inside(m, real):
                raise BindRefused(f"bind of {norm[:200]} is refused: the sandbox covers {m} "
                                  "inside it")
        readonly = entry.readonly or held.readonly or not writable
        return real, readonly


    def seen_as(self, real: str) -> str:
        """The agent's own path for the host path `real` that `resolve` gave:
        where the sandbox shows it (a rootless engine sees the agent's view,
        and binds from it, with the fence's read-only mounts inside)."""
        held = self._source_entry(real)
        if held is None:
            raise BindRefused(f"{real[:200]} is not in the agent's sandbox")
        return _join(held.target, _rest(real, held.source))


def _rest(path: str, base: str) -> str:
    if base == "/":
        return path.lstrip("/")
    return path[len(base):].lstrip("/")


def _join(base: str, rest: str) -> str:
    return posixpath.join(base, rest) if rest else base
