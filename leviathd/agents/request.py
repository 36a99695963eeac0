"""A `Run` request as it comes off the bus: every key and type checked, since
the bus only promised a{sv}. What the caller says here is what to run and
where; never who they are."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from leviathd import safetext
from leviathd.domain.workdir import WORKDIR_MODES
from leviathd.errors import InvalidArgument

# Bounds on what a caller may send, before anything uses or echoes it. The
# kernel's own limits for exec: an argument or variable of at most 128 KiB.
MAX_ARGS = 4096
MAX_ARG = 128 * 1024
MAX_ENV = 4096
MAX_PATH = 4096
MAX_BLUEPRINT = 1024 * 1024


@dataclass
class RunInput:
    command: list[str] = field(default_factory=list)
    blueprint_text: str | None = None
    blueprint_source: str = "<request>"
    workdir: str = ""
    env: dict[str, str] = field(default_factory=dict)
    sandbox: str = ""
    workdir_mode: str = "rw"

    @classmethod
    def from_variants(cls, request: Mapping[str, Any]) -> RunInput:
        """Check every key and type of a Run request: the bus only promised
        a{sv}."""
        expect = {
            "command": "as",
            "blueprint": "s",
            "blueprint_source": "s",
            "workdir": "s",
            "env": "a{ss}",
            "sandbox": "s",
            "workdir_mode": "s",
        }
        values: dict[str, Any] = {}
        for key, var in request.items():
            if key not in expect:
                raise InvalidArgument(f"unknown request key {key!r}; known: {', '.join(expect)}")
            sig = getattr(var, "signature", None)
            if sig != expect[key]:
                raise InvalidArgument(
                    f"request key {key!r} must have type {expect[key]}, not {sig}"
                )
            values[key] = var.value
        req = cls(
            command=list(values.get("command", [])),
            blueprint_text=values.get("blueprint"),
            blueprint_source=values.get("blueprint_source", "<request>"),
            workdir=values.get("workdir", ""),
            env=dict(values.get("env", {})),
            sandbox=values.get("sandbox", ""),
            workdir_mode=values.get("workdir_mode", "rw"),
        )
        # Echoed in errors and the journal: one line, bounded.
        req.blueprint_source = safetext.escape(req.blueprint_source, 256)
        if not req.workdir or not os.path.isabs(req.workdir):
            raise InvalidArgument("workdir must be an absolute path")
        if len(req.workdir) > MAX_PATH or "\0" in req.workdir:
            raise InvalidArgument("workdir is too long or has a NUL byte")
        if len(req.command) > MAX_ARGS or any(len(a) > MAX_ARG for a in req.command):
            raise InvalidArgument(f"command has more than {MAX_ARGS} arguments or one over "
                                  f"{MAX_ARG} characters")
        if req.blueprint_text is not None and len(req.blueprint_text) > MAX_BLUEPRINT:
            raise InvalidArgument(f"blueprint is over {MAX_BLUEPRINT} characters")
        if len(req.env) > MAX_ENV or any(
            not k or "=" in k or "\0" in k or "\0" in v or len(k) + len(v) > MAX_ARG
            for k, v in req.env.items()
        ):
            raise InvalidArgument("env has too many entries, or a name or value that cannot be "
                                  "passed to a program (empty, '=', NUL, over 128 KiB)")
        if req.blueprint_text is None and not req.command:
            raise InvalidArgument("give a blueprint or a command to run")
        if any("\0" in a for a in req.command) or (req.command and not req.command[0]):
            raise InvalidArgument("command has an empty program or a NUL byte")
        if req.sandbox not in ("", "none"):
            raise InvalidArgument("sandbox may only be \"none\" (or left out)")
        if req.workdir_mode not in WORKDIR_MODES:
            raise InvalidArgument(f"workdir_mode must be one of {', '.join(WORKDIR_MODES)}")
        return req
