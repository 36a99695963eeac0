"""Where config files and blueprints live, and reading them into models.

The daemon reads a user's files itself (as that user) and calls `parse_config` /
`parse_blueprint` on the text; local commands use `load_config` / `load_blueprint`. Every
failure is a ConfigError (or NotFound) whose message names the file, the line and the key.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from leviathd.config.errors import toml_error, validation_error
from leviathd.config.models import Blueprint, Config
from leviathd.errors import ConfigError, NotFound
from leviathd.paths import machine_config_path

USER_CONFIG_RELATIVE = Path(".config/leviath/config.toml")
AGENT_STORE_RELATIVE = Path(".local/share/leviath/agents")
BLUEPRINT_FILE = "blueprint.toml"

ENV_USER_CONFIG = "LEVIATH_USER_CONFIG"
ENV_AGENT_STORE = "LEVIATH_AGENT_STORE"

M = TypeVar("M", bound=BaseModel)

# Bounds checked before the text is parsed or validated (issue 22): the daemon
# parses what users send, and the cost of parsing and planning grows with
# these. Far above what a real blueprint or config needs.
MAX_TEXT_BYTES = 256 * 1024
MAX_DEPTH = 16
MAX_STAGES = 64
MAX_SEED_COMMANDS = 64
MAX_MOUNTS = 128
MAX_NODES = 20_000


class ConfigTooLarge(ConfigError):
    """A config or blueprint is over one of the bounds above."""

    dbus_name = "org.leviath.Error.ConfigTooLarge"


def check_text_size(text: str, source: str) -> None:
    """Refuse a text over MAX_TEXT_BYTES before anything else looks at it."""
    # Characters are at most 4 bytes: only texts near the bound are encoded.
    size = len(text)
    if size * 4 > MAX_TEXT_BYTES and size <= MAX_TEXT_BYTES:
        size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_TEXT_BYTES:
        raise ConfigTooLarge(f"{source}: larger than {MAX_TEXT_BYTES // 1024} KiB")


def _check_shape(data: dict[str, Any], source: str) -> None:
    """Depth, size and counts of the parsed table, walked without recursion
    (a deep structure must not make the check itself fail)."""
    nodes = 0
    stack: list[tuple[object, int, str]] = [(data, 1, "")]
    while stack:
        value, depth, key = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ConfigTooLarge(f"{source}: more than {MAX_NODES} values")
        if depth > MAX_DEPTH:
            raise ConfigTooLarge(f"{source}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            stack += [(v, depth + 1, str(k)) for k, v in value.items()]
        elif isinstance(value, list):
            if key == "mounts" and len(value) > MAX_MOUNTS:
                raise ConfigTooLarge(
                    f"{source}: {len(value)} mounts in one list (at most {MAX_MOUNTS})"
                )
            stack += [(v, depth + 1, "") for v in value]
    stages = data.get("stages")
    if isinstance(stages, dict) and len(stages) > MAX_STAGES:
        raise ConfigTooLarge(f"{source}: {len(stages)} stages (at most {MAX_STAGES})")
    seed = data.get("seed")
    commands = seed.get("commands") if isinstance(seed, dict) else None
    if isinstance(commands, list) and len(commands) > MAX_SEED_COMMANDS:
        raise ConfigTooLarge(
            f"{source}: {len(commands)} seed commands (at most {MAX_SEED_COMMANDS})"
        )


def _home(home: str | os.PathLike[str] | None) -> Path:
    return Path(home) if home is not None else Path.home()


def user_config_path(home: str | os.PathLike[str] | None = None) -> Path:
    """~/.config/leviath/config.toml of `home` (default: the caller's), or
    $LEVIATH_USER_CONFIG."""
    env = os.environ.get(ENV_USER_CONFIG)
    return Path(env) if env else _home(home) / USER_CONFIG_RELATIVE


def agent_store_path(home: str | os.PathLike[str] | None = None) -> Path:
    """~/.local/share/leviath/agents of `home` (default: the caller's), or
    $LEVIATH_AGENT_STORE."""
    env = os.environ.get(ENV_AGENT_STORE)
    return Path(env) if env else _home(home) / AGENT_STORE_RELATIVE


def _parse(text: str, source: str, model: type[M]) -> M:
    check_text_size(text, source)
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise toml_error(exc, source) from None
    except RecursionError:
        # tomllib nests by recursion: arrays or inline tables some hundreds deep.
        raise ConfigTooLarge(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
    _check_shape(data, source)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, source, text, model) from None


def parse_config(text: str, source: str) -> Config:
    """Parse a machine or user config.toml; `source` names it in error messages."""
    return _parse(text, source, Config)


def parse_blueprint(text: str, source: str) -> Blueprint:
    """Parse a blueprint.toml; `source` names it in error messages."""
    return _parse(text, source, Blueprint)


def _read(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a TOML file") from None
    except PermissionError:
        raise ConfigError(f"{path}: permission denied") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not valid UTF-8") from None


def load_config(path: str | os.PathLike[str], *, missing_ok: bool = True) -> Config:
    """Read a config file. A file that does not exist is an empty config (every default)
    unless `missing_ok` is False, then NotFound."""
    p = Path(path)
    try:
        text = _read(p)
    except NotFound:
        if missing_ok:
            return Config()
        raise
    return parse_config(text, str(p))


def blueprint_file(path_or_folder: str | os.PathLike[str]) -> Path:
    """A blueprint folder's blueprint.toml, or the file itself when given one."""
    p = Path(path_or_folder)
    return p / BLUEPRINT_FILE if p.is_dir() else p


def load_blueprint(path_or_folder: str | os.PathLike[str]) -> Blueprint:
    """Read a blueprint from its folder or its blueprint.toml."""
    p = blueprint_file(path_or_folder)
    if not p.exists():
        raise NotFound(f"{p}: no such blueprint (expected a folder with {BLUEPRINT_FILE})")
    return parse_blueprint(_read(p), str(p))


def load_configs(home: str | os.PathLike[str] | None = None) -> tuple[Config, Config | None]:
    """The machine config and the user's (None when the user has no file), as local
    commands such as `lev validate` see them."""
    machine = load_config(machine_config_path())
    upath = user_config_path(home)
    user = load_config(upath) if upath.exists() else None
    return machine, user
