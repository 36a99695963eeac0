"""What a configured credential is, spoken by every part that handles one:
the config compiles it (config/policy_settings.py), the policy settings carry
it to the gate (policy/settings.py), the broker runs it (broker/credentials.py,
broker/gitcreds.py) and the daemon's credential service serves it
(creds/). Defined here, on the ground floor, because the broker may not
import the services nor the services' peers the broker's internals. Also the
one PATH a credential command gets, which the broker sets and the fence
(creds/fence.py) keeps. See docs/architecture.md "Where credentials live"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The whole PATH of a credential command: system folders only, none a user
# can write.
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class CredentialSpec:
    """`[credentials.NAME]`: run `command` (plus the agent's arguments) with the
    secret on its standard input; the secret is the content of `secret_file` or
    the output of `secret_command`. `env` is the retired way (the secret in a
    variable): a credential that still sets it is refused when called.
    `from_machine`: defined by the machine config, so the secret is fetched as
    root (an admin's secret the agent's user cannot read); a user's own
    credential is fetched as that user."""

    command: tuple[str, ...]
    secret_file: str
    env: str = ""
    secret_command: tuple[str, ...] = ()
    from_machine: bool = False
    # Whether its fence shows the agent's workdir (read-only) or nothing of it.
    workdir: Literal["none", "ro"] = "none"
    # What the secret serves (config/models.py CredentialConfig): "command",
    # "git" (the sandbox's git credential helper), "cli" (a wrapped CLI) or
    # "ssh" (the sandbox's SSH agent), and their settings. Defaults: a
    # snapshot written before them reads as the command credential it was.
    kind: Literal["command", "git", "cli", "ssh", "http", "azure"] = "command"
    hosts: tuple[str, ...] = ()
    username: str = "x-access-token"
    access: tuple[str, ...] = ("fetch",)
    allow_http: bool = False
    wrap: str = ""
    token_env: str = ""
    known_hosts: tuple[str, ...] = ()
    # kind "http": the header and its value form ("{secret}", or "basic").
    header: str = "Authorization"
    value: str = "Bearer {secret}"
    # kind "azure": the service principal and where its tokens come from.
    tenant: str = ""
    client_id: str = ""
    authority: str = "login.microsoftonline.com"
    scope: str = "https://management.azure.com/.default"
