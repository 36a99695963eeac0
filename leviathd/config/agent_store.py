"""The agent store: installed blueprints, one folder per agent, under
~/.local/share/leviath/agents/<name>/ (or $LEVIATH_AGENT_STORE).

Installing is all or nothing: the blueprint is validated, copied into a temporary folder
inside the store (same file system), validated again there, and renamed into place. A
failure at any step removes what this call created, so a failed `lev add` leaves the disk
as it found it. An installed agent is never replaced silently: that takes `force`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from leviathd import fsat
from leviathd.config.load import BLUEPRINT_FILE, agent_store_path, load_blueprint
from leviathd.config.models import Blueprint
from leviathd.errors import ConfigError, InvalidArgument, LeviathError, NotFound


@dataclass(frozen=True)
class InstalledAgent:
    """One folder of the store: its blueprint, or why it could not be read."""

    name: str
    path: Path
    blueprint: Blueprint | None
    error: str | None = None


def _looks_like_path(arg: str) -> bool:
    return "/" in arg or arg in (".", "..") or arg.endswith(".toml")


def blueprint_folder(arg: str | os.PathLike[str], store: Path | None = None) -> Path:
    """Resolve a BLUEPRINT argument: a path to a blueprint folder or its blueprint.toml
    if one exists there, else the name of an installed agent. Returns the folder."""
    p = Path(arg)
    if p.is_dir() and (p / BLUEPRINT_FILE).is_file():
        return p
    if p.is_file():
        return p.parent
    text = os.fspath(arg)
    store = store if store is not None else agent_store_path()
    if not _looks_like_path(text):
        installed = store / text
        if (installed / BLUEPRINT_FILE).is_file():
            return installed
    if p.is_dir():
        raise NotFound(f"{p}: no {BLUEPRINT_FILE} in this folder")
    raise NotFound(
        f"{text}: no such blueprint (neither a folder with {BLUEPRINT_FILE} nor an agent "
        f"installed in {store})"
    )


def _make_dirs(path: Path) -> list[Path]:
    """mkdir -p, returning the folders it created (deepest last) so they can be undone."""
    created: list[Path] = []
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o755)
        except FileExistsError:
            continue
        created.append(d)
    return created


def install(
    source: str | os.PathLike[str], store: Path | None = None, *, force: bool = False
) -> tuple[Path, Blueprint]:
    """Install the blueprint folder `source` (or the folder of the blueprint.toml given)
    into the store; return where it went and the blueprint. Raises ConfigError for an
    invalid blueprint, InvalidArgument when the agent is installed and not `force`."""
    src = Path(source)
    folder = src.parent if src.is_file() else src
    blueprint = load_blueprint(folder)  # raises before anything is written
    store = store if store is not None else agent_store_path()
    dest = store / blueprint.agent.name
    if dest.exists() and os.path.realpath(dest) == os.path.realpath(folder):
        return dest, blueprint  # installing the installed copy onto itself: nothing to do
    if dest.exists() and not force:
        raise InvalidArgument(
            f"agent '{blueprint.agent.name}' is already installed at {dest}; "
            "use --force to replace it"
        )

    created = _make_dirs(store)
    tmp: Path | None = None
    sfd = -1
    try:
        # The moves and the cleanup go through a descriptor on the store (which
        # may be a folder others can write, say under LEVIATH_AGENT_STORE): a
        # link swapped in for the store or the staging folder is not followed.
        sfd = fsat.open_dir(os.path.abspath(store))
        tmp = Path(tempfile.mkdtemp(prefix=f".{blueprint.agent.name}.new-", dir=store))
        tfd = fsat.open_dir_at(sfd, tmp.name)
        try:
            staged = tmp / "agent"
            # Links are copied as links, never followed: a link in a blueprint folder
            # must not pull the target's contents (say, a key) into the store.
            shutil.copytree(folder, staged, symlinks=True)
            copied = load_blueprint(staged)
            if copied.agent.name != blueprint.agent.name:
                raise ConfigError(f"{folder}: the blueprint changed while it was being installed")
            afd = fsat.open_dir_at(tfd, "agent")
            try:
                os.fchmod(afd, 0o755)
            finally:
                os.close(afd)
            if fsat.lstat_at(sfd, dest.name) is not None:
                _replace(sfd, tfd, dest.name)
            else:
                fsat.rename_at(tfd, "agent", sfd, dest.name)
        finally:
            os.close(tfd)
        return dest, copied
    except LeviathError:
        _undo(sfd, tmp, created)
        raise
    except OSError as exc:
        _undo(sfd, tmp, created)
        raise InvalidArgument(f"cannot install into {store}: {exc.strerror or exc}") from None
    finally:
        if sfd >= 0:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    fsat.remove_tree_at(sfd, tmp.name)
            os.close(sfd)


def _replace(sfd: int, tfd: int, name: str) -> None:
    """Swap the staged `agent` in for `name`; on failure put the old one back."""
    fsat.rename_at(sfd, name, tfd, "old")
    try:
        fsat.rename_at(tfd, "agent", sfd, name)
    except OSError:
        fsat.rename_at(tfd, "old", sfd, name)
        raise


def _undo(sfd: int, tmp: Path | None, created: list[Path]) -> None:
    if tmp is not None and sfd >= 0:
        with contextlib.suppress(OSError):
            fsat.remove_tree_at(sfd, tmp.name)
    for d in reversed(created):
        try:
            parent, name = fsat.open_parent(os.path.abspath(d))
            try:
                fsat.rmdir_at(parent, name)
            finally:
                os.close(parent)
        except OSError:
            break


def list_installed(store: Path | None = None) -> list[InstalledAgent]:
    """Every agent in the store, by name; a folder that does not load is listed with the
    error rather than hidden."""
    store = store if store is not None else agent_store_path()
    if not store.is_dir():
        return []
    out: list[InstalledAgent] = []
    for entry in sorted(store.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(".") or not entry.is_dir():
            continue  # leftovers of an interrupted install are dot-folders
        try:
            out.append(InstalledAgent(entry.name, entry, load_blueprint(entry)))
        except LeviathError as exc:
            out.append(InstalledAgent(entry.name, entry, None, str(exc)))
    return out
