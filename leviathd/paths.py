"""Where leviathd keeps its files, each defined once. The environment
variables move them (the test bed and the VM run a daemon elsewhere); the
defaults are what the unit (units/leviathd.service) and tmpfiles set up."""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR_ENV = "LEVIATH_STATE_DIR"
RUNTIME_DIR_ENV = "LEVIATH_RUNTIME_DIR"
CONFIG_ENV = "LEVIATH_CONFIG"

STATE_DIR = "/var/lib/leviath"
RUNTIME_DIR = "/run/leviath"
MACHINE_CONFIG = Path("/etc/leviath/config.toml")


def state_dir() -> str:
    """Records, snapshots, scratch: kept across restarts and reboots."""
    return os.environ.get(STATE_DIR_ENV, STATE_DIR)


def runtime_dir() -> str:
    """Sockets, pins, exit files: memory, kept across a daemon restart only."""
    return os.environ.get(RUNTIME_DIR_ENV, RUNTIME_DIR)


def machine_config_path() -> Path:
    """/etc/leviath/config.toml, or $LEVIATH_CONFIG."""
    env = os.environ.get(CONFIG_ENV)
    return Path(env) if env else MACHINE_CONFIG
