"""Where config files and blueprints live, and reading them into models.

The daemon reads a user's files itself (as that user) and calls `parse_config` /
`parse_blueprint` on the text; local commands use `load_config` / `load_blueprint`. Every
failure is a ConfigError (or NotFound) whose message names the file, the line and the key.
"""

from __future__ import annotations

import errno
import os
import stat
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from leviathd.config.errors import toml_error, validation_error
from leviathd.config.models import Blueprint, Config, RulesFile
from leviathd.errors import ConfigError, NotFound
from leviathd.paths import machine_config_path

USER_CONFIG_RELATIVE = Path(".config/leviath/config.toml")
AGENT_STORE_RELATIVE = Path(".local/share/leviath/agents")
BLUEPRINT_FILE = "blueprint.toml"
# Beside the machine config: [[rules]] files of the admin's, one a concern.
RULES_DIR = "rules.d"
MAX_RULE_FILES = 64
MAX_MACHINE_RULES = 256  # the machine config's and rules.d's together

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
    machine = load_machine(machine_config_path())
    upath = user_config_path(home)
    user = load_config(upath) if upath.exists() else None
    return machine, user


def machine_rules_dir(config_path: str | os.PathLike[str]) -> Path:
    """/etc/leviath/rules.d: beside the machine config ($LEVIATH_CONFIG moves both)."""
    return Path(config_path).parent / RULES_DIR


def _not_roots(st: os.stat_result) -> str:
    """Why a file or folder is not the admin's alone ("" when it is)."""
    if st.st_uid != 0:
        return f"owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {st.st_mode & 0o7777:o})"
    return ""


def parse_rules_file(text: str, source: str) -> RulesFile:
    """A rules.d file: `[[rules]]` tables and nothing else."""
    return _parse(text, source, RulesFile)


def load_rules_dir(folder: str | os.PathLike[str]) -> list[tuple[str, RulesFile]]:
    """The `*.toml` files of `folder` in name order, each parsed, as (path,
    rules). Machine policy, so only root's: the folder and each file must be
    root's and writable by nobody else, or the whole set is refused (a
    ConfigError, as for a broken machine config: the daemon keeps the last
    good configuration, or starts no agent). Opened by descriptor, with
    O_NOFOLLOW, so a link cannot lead the read elsewhere. A missing folder is
    no rules."""
    path = Path(folder)
    try:
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ConfigError(f"{path}: not a folder (a link is not followed)") from None
        raise ConfigError(f"{path}: cannot open: {exc.strerror}") from None
    try:
        why = _not_roots(os.fstat(dfd))
        if why:
            raise ConfigError(f"{path}: {why}; machine rules are root's alone")
        names = sorted(n for n in os.listdir(dfd)
                       if n.endswith(".toml") and not n.startswith("."))
        if len(names) > MAX_RULE_FILES:
            raise ConfigTooLarge(f"{path}: {len(names)} files (at most {MAX_RULE_FILES})")
        return [(str(path / name), _read_rules_at(dfd, path / name)) for name in names]
    finally:
        os.close(dfd)


def _read_rules_at(dfd: int, path: Path) -> RulesFile:
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{path}: a symbolic link; machine rules are regular files") \
                from None
        raise ConfigError(f"{path}: cannot open: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: not a regular file")
        why = _not_roots(st)
        if why:
            raise ConfigError(f"{path}: {why}; machine rules are root's alone")
        if st.st_size > MAX_TEXT_BYTES:
            raise ConfigTooLarge(f"{path}: larger than {MAX_TEXT_BYTES // 1024} KiB")
        raw = os.read(fd, MAX_TEXT_BYTES + 1)
    finally:
        os.close(fd)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not valid UTF-8") from None
    return parse_rules_file(text, str(path))


def with_rules_dir(machine: Config, source: str, folder: str | os.PathLike[str]) -> Config:
    """The machine config with rules.d's rules after its own [[rules]]."""
    return combine_rules(machine, source, load_rules_dir(folder), str(folder))


def combine_rules(
    machine: Config, source: str, files: list[tuple[str, RulesFile]], folder: str
) -> Config:
    """rules.d's rules after the machine config's own (file name order),
    checked together: at most MAX_MACHINE_RULES, names unique (a name is what
    the audit and `lev policy test` show)."""
    if not files:
        return machine
    seen: dict[str, str] = {r.name: source for r in machine.rules}
    rules = list(machine.rules)
    for path, got in files:
        for r in got.rules:
            if r.name in seen:
                raise ConfigError(f"{path}: rule {r.name!r} is already defined in {seen[r.name]}")
            seen[r.name] = path
            rules.append(r)
    if len(rules) > MAX_MACHINE_RULES:
        raise ConfigTooLarge(f"{folder}: {len(rules)} machine rules with the machine config's "
                             f"(at most {MAX_MACHINE_RULES})")
    return machine.model_copy(update={"rules": rules})


def load_machine(path: str | os.PathLike[str]) -> Config:
    """The machine config (a missing file is every default) and its rules.d."""
    return with_rules_dir(load_config(path), str(path), machine_rules_dir(path))
