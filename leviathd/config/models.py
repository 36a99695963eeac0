"""The configuration and blueprint schema, as pydantic v2 models.

One model, `Config`, serves both the machine's /etc/leviath/config.toml and a user's
~/.config/leviath/config.toml; `Blueprint` is a blueprint folder's blueprint.toml. Every
model forbids unknown keys (a typo is an error, not a silently ignored setting) and is
frozen. Fields a lower layer may tighten are Optional with None meaning "not set here", so
the merge (leviathd/config/merge.py) can tell "unset" from "set to the default"; the
defaults themselves live in the merge's `Effective`, documented in docs/configuration.md.
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from leviathd.domain.allowrule import AllowRule
from leviathd.domain.engine import Engine
from leviathd.domain.mounts import Access, MountPath, MountRequest
from leviathd.domain.permission import Permission
from leviathd.domain.protectedpaths import check_config_path as check_protected_path
from leviathd.domain.sandbox import SandboxKind
from leviathd.domain.sensitivity import Label, Sensitivity
from leviathd.policy.cel import CelError
from leviathd.policy.rules import compile_rule
from leviathd.policy.tooldef import (
    DEFAULT_TIMEOUT,
    MAX_TOOLS,
    ToolDefError,
    check_name,
    make_tool,
)
from leviathd.readpatterns import parse_pattern


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ------------------------------------------------------------------------------ enums


class OnUnavailable(StrEnum):
    ERROR = "error"
    WARN = "warn"

    @property
    def rank(self) -> int:
        """Strictness: error (refuse to run unfenced) is stricter than warn."""
        return 1 if self is OnUnavailable.ERROR else 0


class TaintPolicy(StrEnum):
    """What happens when data is more sensitive than a tool's clearance."""

    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"

    @property
    def rank(self) -> int:
        return Permission(self.value).rank


# ------------------------------------------------------------------- value checkers
# The patterns end in \Z, not $: with re.match, $ also matches before a final
# newline, so "name\n" would pass as a name.

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")


def _argv(value: list[str]) -> list[str]:
    if not value:
        raise ValueError("must be a non-empty list of strings (an argv)")
    for arg in value:
        if "\0" in arg:
            raise ValueError("an argument contains a NUL byte")
    if not value[0]:
        raise ValueError("the program (first element) is empty")
    return value


def _absolute_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path, not {value!r}")
    if "\0" in value:
        raise ValueError("contains a NUL byte")
    return value


def _env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid environment variable name")
    return value


_ENV_PATTERN = re.compile(r"^[A-Za-z0-9_*?\[\]!-]+\Z")


def _env_pattern(value: str) -> str:
    # env_pass / env_withhold take names or fnmatch patterns such as "LC_*".
    if not _ENV_PATTERN.match(value):
        raise ValueError(f"{value!r} is not an environment variable name or pattern (like LC_*)")
    return value


def _name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: use letters, digits, '-' and '_', "
            "starting with a letter or digit, at most 64 characters"
        )
    return value


def _read_path(value: str) -> str:
    parse_pattern(value)  # raises ReadPathError (a ValueError) saying what is wrong
    return value


Argv = Annotated[list[str], AfterValidator(_argv)]
AbsolutePath = Annotated[str, AfterValidator(_absolute_path)]
ProtectedPath = Annotated[str, AfterValidator(check_protected_path)]
EnvName = Annotated[str, AfterValidator(_env_name)]
EnvPattern = Annotated[str, AfterValidator(_env_pattern)]
Name = Annotated[str, AfterValidator(_name)]
ReadPathPattern = Annotated[str, AfterValidator(_read_path)]


# ------------------------------------------------------------- sizes and percentages

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE = re.compile(r"^\s*(\d+)\s*([KMGTkmgt]?)\s*$")


def parse_size(value: object) -> int | None:
    """systemd-style byte size: an int, or "512M", "2G" (K/M/G/T, base 1024); "infinity"
    means no limit (None)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError('must be a size such as "512M" or "2G", not a boolean')
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    if isinstance(value, str):
        if value.strip().lower() == "infinity":
            return None
        m = _SIZE.match(value)
        if m:
            return int(m.group(1)) * _UNITS[m.group(2).upper()]
    raise ValueError(
        f'must be a size in bytes such as 536870912, "512M" or "2G" (K, M, G, T are '
        f'powers of 1024), or "infinity"; got {value!r}'
    )


def _scratch_share(value: object) -> str | None:
    """`scratch_user_max`: "NN%" (1-100) of scratch_dir's filesystem, or a
    size ("20G"), kept as "NN%" or a number of bytes."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            n = int(value.strip()[:-1])
        except ValueError:
            n = 0
        if not 1 <= n <= 100:
            raise ValueError(f'must be a share from "1%" to "100%", or a size; got {value!r}')
        return f"{n}%"
    size = parse_size(value)
    if size is None:
        return None
    return str(size)


def parse_count(value: object) -> int | None:
    """A positive count, or "infinity" (None)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == "infinity":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError(f'must be a whole number of at least 1, or "infinity"; got {value!r}')


def parse_percent(value: object) -> int | None:
    """A CPU quota: "150%" (one and a half CPUs) or the number 150."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str):
        m = re.match(r"^\s*(\d+)\s*%\s*$", value)
        if m and int(m.group(1)) >= 1:
            return int(m.group(1))
    raise ValueError(f'must be a percentage of one CPU such as "150%"; got {value!r}')


def _cpu_weight(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 10000:
        return value
    raise ValueError(f"must be a whole number from 1 to 10000; got {value!r}")


# --------------------------------------------------------------------------- sections


def _network(value: object) -> bool | Literal["proxy"] | None:
    # One message for the three values (a union would report one error per member).
    if value is None or isinstance(value, bool) or value == "proxy":
        return value
    raise ValueError(f'must be true, false or "proxy"; got {value!r}')
_CAPABILITY = re.compile(r"^(CAP_)?[A-Z_]{2,32}$")


def _capability(value: str) -> str:
    name = value.strip().upper()
    if not _CAPABILITY.match(name) or name in ("ALL", "CAP_ALL"):
        raise ValueError(f"{value!r} is not a capability name such as SYS_PTRACE")
    return name.removeprefix("CAP_")


Capability = Annotated[str, AfterValidator(_capability)]


class Publish(StrEnum):
    LOOPBACK = "loopback"
    ANY = "any"

    @property
    def rank(self) -> int:
        """Looseness: loopback (127.0.0.1 only) is tighter than any."""
        return 0 if self is Publish.LOOPBACK else 1


def _upload_max(value: object) -> int | None:
    size = parse_size(value)
    if size is None and value is not None:
        raise ValueError('must be a size such as "4G": "infinity" is not allowed (what an '
                         "agent uploads the engine stores on the machine's disk)")
    return size


def _image_store_max(value: object) -> int | None:
    size = parse_size(value)
    if size is None and value is not None:
        raise ValueError('must be a size such as "10G", or 0 to keep no images: "infinity" is '
                         "not allowed (the store is on the machine's disk)")
    return size


class ContainersConfig(_Model):
    """`[sandbox.containers]`: the filtered container-engine socket of each agent
    (leviathd/enginesock). None = not set here."""

    enabled: StrictBool | None = None
    cap_add: list[Capability] | None = None
    publish: Publish | None = None
    # The engine behind the socket is root on the host: the daemon's rootful
    # podman service, or `socket`. Machine config only, off by default; without
    # it each agent gets its user's own rootless podman (leviathd/enginesock/rootless.py).
    host_root_engine: StrictBool | None = None
    socket: AbsolutePath | None = None
    # Bytes an agent may stream to the engine in request bodies over its
    # life (build contexts, image loads and imports, copies into containers).
    upload_max: Annotated[int | None, BeforeValidator(_upload_max)] = None
    # The user's image store (enginesock/imagestore.py): what the user's
    # agents pulled, loaded or built, kept for their next agents, its oldest
    # images removed past this size; 0 keeps none.
    image_store_max: Annotated[int | None, BeforeValidator(_image_store_max)] = None


class SandboxConfig(_Model):
    """`[sandbox]`, in a config, a blueprint or a blueprint's stage. None = not set here."""

    kind: SandboxKind | None = None
    engine: Engine | None = None
    image: str | None = None
    # true: the host's network; "proxy": only lo, out through the daemon's
    # gated proxy (leviathd/proxy); false: only lo.
    network: Annotated[bool | Literal["proxy"] | None, PlainValidator(_network)] = None
    mounts: list[MountRequest] | None = None
    default_mounts: StrictBool | None = None
    on_unavailable: OnUnavailable | None = None
    scratch_dir: AbsolutePath | None = None
    scratch_size: Annotated[int | None, BeforeValidator(parse_size)] = None
    # What one user's agents' scratch may take of scratch_dir's filesystem,
    # "NN%" of it or a size (machine config only); default DEFAULT_SCRATCH_USER_MAX.
    scratch_user_max: Annotated[str | None, BeforeValidator(_scratch_share)] = None
    # io_uring is refused in every sandbox unless the machine config allows it.
    allow_io_uring: StrictBool | None = None
    containers: ContainersConfig | None = None
    # Added to the built-in list (leviathd/sandbox/protected.py), never removed from it.
    protected_paths: list[ProtectedPath] | None = None
    # Repositories (their folders) whose tracked hook managers' files (husky's
    # .husky/, lefthook.yml, .envrc, ...) agents may write: read-only elsewhere.
    # Machine and user configs only (a blueprint's is ignored).
    hook_files_writable: list[MountPath] | None = None


class Resources(_Model):
    """`[resources]`, parsed: memory in bytes, CPU quota in percent of one CPU. None means
    no limit (unset, or "infinity")."""

    memory_max: Annotated[int | None, BeforeValidator(parse_size)] = None
    tasks_max: Annotated[int | None, BeforeValidator(parse_count)] = None
    cpu_quota: Annotated[int | None, BeforeValidator(parse_percent)] = None
    cpu_weight: Annotated[int | None, BeforeValidator(_cpu_weight)] = None


def _limit_size(value: object) -> int:
    size = parse_size(value)
    if size is None or size < 1:
        raise ValueError('must be a size of at least 1 byte, such as "1M" (a broker limit '
                         'cannot be "infinity")')
    return size


def _limit_count(value: object) -> int:
    count = parse_count(value)
    if count is None:
        raise ValueError('must be a whole number of at least 1 (a broker limit cannot be '
                         '"infinity")')
    return count


BrokerSize = Annotated[int | None, BeforeValidator(_limit_size)]
BrokerCount = Annotated[int | None, BeforeValidator(_limit_count)]


class BrokerConfig(_Model):
    """`[broker]`: limits on every agent's tool calls. Read from the machine
    config only (a user cannot raise them). None = the built-in default."""

    read_max_bytes: BrokerSize = None
    read_max_paths: BrokerCount = None
    reply_max_bytes: BrokerSize = None
    edit_max_bytes: BrokerSize = None
    request_max_bytes: BrokerSize = None
    json_max_depth: BrokerCount = None
    max_concurrent_calls: BrokerCount = None
    max_connections: BrokerCount = None
    max_pending_approvals: BrokerCount = None


class SecurityConfig(_Model):
    read_paths: list[ReadPathPattern] = Field(default_factory=list)
    allow_blueprint_read_paths: StrictBool | None = None
    # Never implemented: still parsed so old files load, ignored with a
    # credential-store-ignored finding (config/merge.py).
    credential_store: str | None = None
    hidden_paths: list[MountPath] = Field(default_factory=list)
    env_pass: list[EnvPattern] = Field(default_factory=list)
    env_withhold: list[EnvPattern] = Field(default_factory=list)


class AgentReadPaths(_Model):
    allow: list[ReadPathPattern] = Field(default_factory=list)


class TaintConfig(_Model):
    enabled: StrictBool | None = None
    on_exceed: TaintPolicy | None = None
    budget: Annotated[StrictInt, Field(ge=1)] | None = None
    approval_timeout: Annotated[StrictInt, Field(ge=1)] | None = None
    clearance: dict[str, Label] = Field(default_factory=dict)
    allow_private_addresses: StrictBool | None = None


_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_DOMAIN = re.compile(rf"^(\*\.)?({_LABEL}\.)*{_LABEL}$")


def _domain(value: str) -> str:
    v = value.strip().lower().rstrip(".")
    if len(v) > 253 or not _DOMAIN.match(v):
        raise ValueError(f"not a domain name or *.domain pattern: {value!r}")
    return v


DomainPattern = Annotated[str, AfterValidator(_domain)]


def _private_range(value: str) -> str:
    try:
        net = ipaddress.ip_network(value.strip(), strict=False)
    except ValueError:
        raise ValueError(f"{value[:80]!r} is not an address range such as 192.168.1.0/24") from None
    if not net.is_private or net.is_loopback or net.is_link_local or net.prefixlen == 0:
        # Loopback has host_ports; link-local and metadata stay closed.
        raise ValueError(f"{value[:80]!r} is not a private (LAN) range; loopback is opened "
                         "by host_ports, link-local never")
    return str(net)


PrivateRange = Annotated[str, AfterValidator(_private_range)]


class ProxyConfig(_Model):
    """`[proxy]`: the policy of `network = "proxy"` (leviathd/proxy). Each layer
    (machine, user, blueprint) only narrows: a connection must pass every
    layer's `allow_domains` and `ports`, any layer's `deny_domains` refuses it,
    and the lowest `clearance` of any matching pattern applies."""

    allow_domains: list[DomainPattern] | None = None
    deny_domains: list[DomainPattern] = Field(default_factory=list)
    ports: list[Annotated[StrictInt, Field(ge=1, le=65535)]] | None = None
    clearance: dict[DomainPattern, Label] = Field(default_factory=dict)
    max_connections: Annotated[StrictInt, Field(ge=1, le=4096)] | None = None
    # Openings the proxy otherwise refuses (issue 30): ports of the host's own
    # loopback (a dev server on localhost:3000) and private/LAN ranges. Opened
    # by the configs; a blueprint's only narrow them (leviathd/config/merge.py).
    host_ports: Annotated[list[Annotated[StrictInt, Field(ge=1, le=65535)]],
                          Field(max_length=64)] | None = None
    private_ranges: Annotated[list[PrivateRange], Field(max_length=64)] | None = None
    # Issue 45: the agent CLIs' logins stay on the host and are swapped in at
    # the egress (proxy/logins.py). On unless the machine or user config turns
    # it off; a blueprint cannot (it would show the real tokens to its agent).
    cli_logins: StrictBool | None = None


class PolicyRule(_Model):
    """`[[rules]]`: when the CEL condition `when` holds for a call, `decision`
    (allow, deny or ask) with `reason` (docs/configuration.md)."""

    name: Name
    when: str
    decision: Literal["allow", "deny", "ask"]
    reason: Annotated[str, Field(max_length=200)] = ""

    @field_validator("when")
    @classmethod
    def _compiles(cls, value: str, info: ValidationInfo) -> str:
        # Compiled here so a bad rule is refused at load with its file, line
        # and name (the column is the expression's own); the daemon compiles
        # it again from the snapshot.
        try:
            compile_rule(value)
        except CelError as exc:
            name = info.data.get("name", "?")
            raise ValueError(f"rule {name!r} does not compile: {exc}") from None
        return value


class RulesFile(_Model):
    """A file of /etc/leviath/rules.d: machine `[[rules]]`, nothing else."""

    rules: Annotated[list[PolicyRule], Field(max_length=256)] = Field(default_factory=list)


_HOST_PATTERN = re.compile(r"^[A-Za-z0-9*?.\-\[\]]{1,253}(:[0-9]{1,5})?\Z")
_WRAP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


def _host_pattern(value: str) -> str:
    if not _HOST_PATTERN.match(value):
        raise ValueError(f"{value[:80]!r} is not a host name or pattern (like *.example.com)")
    return value.lower()


HostPattern = Annotated[str, AfterValidator(_host_pattern)]
# kind "azure": a tenant (GUID or domain) or an application (client) id, and
# the authority host the daemon asks for tokens (a plain name, port optional).
AzureId = Annotated[str, Field(min_length=1, max_length=128,
                                 pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*$")]
AuthorityHost = Annotated[str, Field(min_length=1, max_length=253,
                                     pattern=r"^[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?$")]
# Azure Resource Manager: what `az` and the SDKs' management clients talk to.
AZURE_HOSTS = ("management.azure.com",)
CredentialKind = Literal["command", "git", "cli", "ssh", "http", "azure"]
GitAccess = Literal["fetch", "push"]


class CredentialConfig(_Model):
    """`[credentials.NAME]`: what the secret is for (`kind`) and where it comes from
    (exactly one of `secret_file`, an absolute path, or `secret_command`, whose
    standard output is the secret). kind "command" (default): the credential tool
    runs `command` (the agent adds arguments), which reads the secret from its
    standard input. kind "git": the sandbox's git credential helper is given the
    secret as the password for `hosts` (fetch, and push when `access` says so).
    kind "cli": `wrap` (a name first on the sandbox's PATH) runs `command` in the
    credential fence with the secret in `token_env`. kind "ssh": the sandbox's
    SSH agent signs with the private key in the secret, for `hosts` only.
    `env` (the secret in a variable of the command's environment, where its user
    could read it) is retired: still parsed so that old files load, refused when
    the credential is used."""

    kind: CredentialKind = "command"
    command: Argv | None = None
    secret_file: AbsolutePath | None = None
    secret_command: Argv | None = None
    env: EnvName | None = None
    # "ro": the command's fence shows the agent's workdir read-only; "none"
    # (default): nothing of it. It never runs in it (docs/security-model.md).
    workdir: Literal["none", "ro"] = "none"
    # kind "git", "ssh" and "http": the hosts (fnmatch patterns, host or host:port)
    # covered; kind "cli" with hosts: its CLI runs in the agent's own fence and
    # the proxy injects the secret toward them (issue 30).
    hosts: Annotated[list[HostPattern], Field(max_length=64)] = Field(default_factory=list)
    # kind "git": the user name git sends with the token; which operations get it;
    # whether plain http (the token in clear on the wire) is served too.
    username: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^\s:]+$")] = (
        "x-access-token"
    )
    access: Annotated[list[GitAccess], Field(min_length=1, max_length=2)] = (
        Field(default_factory=lambda: list[GitAccess](["fetch"]))
    )
    allow_http: bool = False
    # kind "cli": the name of the wrapper, and the variable the real CLI reads.
    wrap: str | None = None
    token_env: EnvName | None = None
    # kind "http" (issue 30): the header the proxy puts the secret in toward
    # `hosts`, and its value ("{secret}" is replaced; "basic": basic auth with
    # `username`). `token_env` then names the sandbox variable holding the
    # placeholder (e.g. GH_TOKEN).
    header: Annotated[str, Field(min_length=1, max_length=64,
                                 pattern=r"^[A-Za-z0-9-]+$")] = "Authorization"
    value: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\r\n\x00]*$")] = (
        "Bearer {secret}")
    # kind "ssh": known_hosts files mapping host keys to names (read as the
    # secret is); default the user's ~/.ssh/known_hosts and /etc/ssh/ssh_known_hosts.
    known_hosts: Annotated[list[AbsolutePath], Field(max_length=8)] = Field(default_factory=list)
    # kind "azure" (issue 30 item 5): a service principal, its client secret
    # from secret_file/secret_command. The daemon runs the client-credentials
    # flow at `authority` for `scope` and the proxy puts the bearer token
    # toward `hosts` (default: Azure Resource Manager), proxy/azure.py.
    tenant: AzureId | None = None
    client_id: AzureId | None = None
    authority: AuthorityHost = "login.microsoftonline.com"
    scope: Annotated[str, Field(min_length=1, max_length=256,
                                pattern=r"^[A-Za-z0-9:/._-]+$")] = (
        "https://management.azure.com/.default")

    @model_validator(mode="before")
    @classmethod
    def _azure_hosts(cls, data: Any) -> Any:
        """kind "azure" without hosts: Azure Resource Manager's."""
        if isinstance(data, dict) and data.get("kind") == "azure" and not data.get("hosts"):
            return {**data, "hosts": list(AZURE_HOSTS)}
        return data

    @model_validator(mode="after")
    def _one_source(self) -> CredentialConfig:
        if (self.secret_file is None) == (self.secret_command is None):
            raise ValueError("set exactly one of secret_file or secret_command")
        if self.kind in ("command", "cli") and not self.command:
            raise ValueError(f"a credential of kind {self.kind!r} needs command")
        if self.kind == "http" and self.value != "basic" and "{secret}" not in self.value:
            raise ValueError('kind "http": value must hold {secret} or be "basic"')
        if self.kind in ("git", "ssh", "http") and not self.hosts:
            raise ValueError(f"a credential of kind {self.kind!r} needs hosts")
        if self.kind == "azure" and (not self.tenant or not self.client_id):
            raise ValueError("a credential of kind 'azure' needs tenant and client_id")
        if self.kind == "cli":
            if not self.token_env:
                raise ValueError("a credential of kind 'cli' needs token_env (e.g. GH_TOKEN)")
            assert self.command is not None
            name = self.wrap or self.command[0].rsplit("/", 1)[-1]
            if not _WRAP_NAME.match(name) or name.startswith("git-credential"):
                raise ValueError(f"wrap = {name[:80]!r} is not a program name")
        return self


class RecordsConfig(_Model):
    """Retention of ended agents' records (machine config only): an ended agent
    is forgotten once it ended more than keep_days ago, or once its user has
    more than max_per_user ended agents (the oldest go first)."""

    keep_days: Annotated[StrictInt, Field(ge=0, le=36500)] = 30
    max_per_user: Annotated[StrictInt, Field(ge=0, le=1_000_000)] = 1000


class LimitsConfig(_Model):
    """`[limits]` (machine config only): what one user may hold at once.
    None = no cap but the kernel's (its key quota, agents/admission.py)."""

    agents_per_user: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = None


def _metrics_file(value: str) -> str:
    return value if value == "" else _absolute_path(value)


class MetricsConfig(_Model):
    """`[metrics]` (machine config only): the OpenMetrics file for node
    exporter's textfile collector (leviathd/metricsfile.py); "" = none."""

    file: Annotated[str, AfterValidator(_metrics_file)] = (
        "/var/lib/prometheus/node-exporter/leviathd.prom")
    interval: Annotated[StrictInt, Field(ge=1, le=3600)] = 30


class FolderGrant(_Model):
    """`[[folders]]`: a folder shown to one installed agent (`agent`), to every
    agent whose workdir is in one repository (`repository`), or to that agent
    in that repository (both): the Legato spec's resources."""

    path: MountPath
    access: Access = Access.READ
    agent: Name | None = None
    repository: MountPath | None = None

    @model_validator(mode="after")
    def _for_someone(self) -> FolderGrant:
        if self.agent is None and self.repository is None:
            raise ValueError("a folder names the agent or the repository it is for "
                             "([sandbox] mounts give a folder to every agent)")
        return self


MAX_FOLDERS = 256


class Config(_Model):
    """A machine or user config.toml. Every section is optional."""

    sandbox: SandboxConfig | None = None
    resources: Resources = Field(default_factory=Resources)
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    agent_read_paths: dict[str, AgentReadPaths] = Field(default_factory=dict)
    tool_permissions: dict[str, Permission] = Field(default_factory=dict)
    agent_tool_permissions: dict[str, dict[str, Permission]] = Field(default_factory=dict)
    taint: TaintConfig = Field(default_factory=TaintConfig)
    allowlist: list[AllowRule] = Field(default_factory=list)
    rules: Annotated[list[PolicyRule], Field(max_length=256)] = Field(default_factory=list)
    credentials: dict[Name, CredentialConfig] = Field(default_factory=dict)
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    records: RecordsConfig = Field(default_factory=RecordsConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    folders: Annotated[list[FolderGrant], Field(max_length=MAX_FOLDERS)] = Field(
        default_factory=list)


# -------------------------------------------------------------------------- blueprint


class AgentSection(_Model):
    name: Name
    version: str = "0.0.0"
    description: str = ""
    command: Argv | None = None


class SeedSection(_Model):
    commands: list[Argv] = Field(default_factory=list)


class Stage(_Model):
    command: Argv
    description: str = ""
    sandbox: SandboxConfig | None = None


class ReadPathsSection(_Model):
    allow: list[ReadPathPattern] = Field(default_factory=list)


def _env_table(value: dict[str, str]) -> dict[str, str]:
    for key, val in value.items():
        _env_name(key)
        if "\0" in val:
            raise ValueError(f"{key}: value contains a NUL byte")
    return value


class BlueprintTool(_Model):
    """`[tools.NAME]`: a command the agent may call as a tool, run in the
    agent's own fence (leviathd/policy/tooldef.py: the schema subset and the
    substitution rules; docs/configuration.md)."""

    description: Annotated[str, Field(max_length=500)] = ""
    # A JSON Schema (subset) of the arguments; `arguments` rather than
    # `schema`, which pydantic's BaseModel already uses.
    arguments: dict[str, Any] = Field(default_factory=dict)
    argv: Argv
    output: Label = Sensitivity.INTERNAL
    sends_data: StrictBool = False
    timeout: Annotated[StrictInt, Field(ge=1, le=300)] = DEFAULT_TIMEOUT

    @model_validator(mode="after")
    def _usable(self) -> BlueprintTool:
        # Checked here so the error names the tool's own table and line; its
        # name is the table's key, checked below.
        try:
            make_tool("tool", description=self.description, schema=self.arguments,
                      argv=self.argv, output=str(self.output), sends_data=self.sends_data,
                      timeout=self.timeout)
        except ToolDefError as exc:
            raise ValueError(str(exc)) from None
        return self


def _tools(value: dict[str, BlueprintTool]) -> dict[str, BlueprintTool]:
    if len(value) > MAX_TOOLS:
        raise ValueError(f"at most {MAX_TOOLS} tools")
    for name in value:
        try:
            check_name(name)
        except ToolDefError as exc:
            raise ValueError(f"[tools.{name[:64]}]: {exc}") from None
    return value


class Blueprint(_Model):
    """A blueprint folder's blueprint.toml. Stages keep the file's order."""

    agent: AgentSection
    seed: SeedSection = Field(default_factory=SeedSection)
    stages: dict[Name, Stage] = Field(default_factory=dict)
    sandbox: SandboxConfig | None = None
    read_paths: ReadPathsSection = Field(default_factory=ReadPathsSection)
    permissions: dict[str, Permission] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    env: Annotated[dict[str, str], AfterValidator(_env_table)] = Field(default_factory=dict)
    proxy: ProxyConfig = Field(default_factory=ProxyConfig)
    rules: Annotated[list[PolicyRule], Field(max_length=256)] = Field(default_factory=list)
    tools: Annotated[dict[str, BlueprintTool], AfterValidator(_tools)] = Field(
        default_factory=dict)

    @model_validator(mode="after")
    def _has_something_to_run(self) -> Blueprint:
        if self.agent.command is None and not self.stages:
            raise ValueError("a blueprint needs [agent] command or at least one [stages.NAME]")
        return self

    @property
    def name(self) -> str:
        return self.agent.name


def dump(model: BaseModel) -> dict[str, Any]:
    """A model as plain data (enums as their strings), e.g. for --json output."""
    return model.model_dump(mode="json", exclude_none=True)
