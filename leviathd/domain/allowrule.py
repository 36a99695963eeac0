"""An `[[allowlist]]` entry: `tool` may send to `target` (a glob) data up to
`max_sensitivity`. The config reads it from TOML, the settings snapshot
carries it, the gate compiles it (leviathd/policy/allowlist.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from leviathd.domain.sensitivity import Label


class AllowRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str
    target: str
    max_sensitivity: Label
