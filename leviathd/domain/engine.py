"""The container engine an admin chooses (`[sandbox] engine`): `auto` takes
podman, then docker (leviathd/sandbox/engine.py detects which is there)."""

from __future__ import annotations

from enum import StrEnum


class Engine(StrEnum):
    AUTO = "auto"
    PODMAN = "podman"
    DOCKER = "docker"
