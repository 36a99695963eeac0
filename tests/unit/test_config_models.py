"""The config and blueprint schema: what parses, into what."""

from __future__ import annotations

from pathlib import Path

import pytest

from leviathd.config.load import parse_blueprint, parse_config
from leviathd.config.models import (
    Blueprint,
    Config,
    OnUnavailable,
    Permission,
    Resources,
    SandboxKind,
    TaintPolicy,
    parse_percent,
    parse_size,
)
from leviathd.domain.engine import Engine
from leviathd.domain.mounts import Access
from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import ConfigError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

FULL_CONFIG = """
[sandbox]
kind = "container"
engine = "podman"
image = "debian:bookworm-slim"
network = false
mounts = [{ path = "~/specs" }, { path = "/srv/cache", access = "write" }]
default_mounts = false
on_unavailable = "warn"
scratch_dir = "/mnt/big/scratch"

[resources]
memory_max = "2G"
tasks_max = 512
cpu_quota = "150%"
cpu_weight = 50

[security]
read_paths = ["~/.leviath/runs"]
allow_blueprint_read_paths = false
credential_store = "keyring"
hidden_paths = ["~/.private", "/srv/secrets"]
env_pass = ["LANG"]
env_withhold = ["MY_TOKEN"]

[agent_read_paths.cto]
allow = ["glob:~/design-docs/**"]

[tool_permissions]
shell = "ask"
web_fetch = "deny"

[agent_tool_permissions.cto]
shell = "deny"

[taint]
enabled = true
on_exceed = "deny"
budget = 64
approval_timeout = 30
clearance = { http_post = "public", web_fetch = "internal" }
allow_private_addresses = false

[[allowlist]]
tool = "http_post"
target = "*.example.com"
max_sensitivity = "internal"

[credentials.github]
command = ["gh", "api"]
secret_command = ["pass", "show", "github"]
env = "GITHUB_TOKEN"

[credentials.api]
command = ["curl", "-H", "@-"]
secret_file = "/etc/leviath/api.key"
env = "API_KEY"
"""


def test_every_section_and_key_of_the_schema_parses_into_typed_values() -> None:
    c = parse_config(FULL_CONFIG, "config.toml")
    assert c.sandbox is not None
    assert c.sandbox.kind is SandboxKind.CONTAINER
    assert c.sandbox.engine is Engine.PODMAN
    assert c.sandbox.network is False
    assert c.sandbox.mounts is not None
    assert [(m.path, m.access) for m in c.sandbox.mounts] == [
        ("~/specs", Access.READ),
        ("/srv/cache", Access.WRITE),
    ]
    assert c.sandbox.on_unavailable is OnUnavailable.WARN
    assert c.resources == Resources(
        memory_max=2 * 1024**3, tasks_max=512, cpu_quota=150, cpu_weight=50
    )
    assert c.security.hidden_paths == ["~/.private", "/srv/secrets"]
    assert c.agent_read_paths["cto"].allow == ["glob:~/design-docs/**"]
    assert c.tool_permissions == {"shell": Permission.ASK, "web_fetch": Permission.DENY}
    assert c.agent_tool_permissions["cto"]["shell"] is Permission.DENY
    assert c.taint.on_exceed is TaintPolicy.DENY
    assert c.taint.clearance["http_post"] is Sensitivity.PUBLIC
    assert c.allowlist[0].max_sensitivity is Sensitivity.INTERNAL
    assert c.credentials["github"].command == ["gh", "api"]
    assert c.credentials["github"].secret_command == ["pass", "show", "github"]
    assert c.credentials["github"].env == "GITHUB_TOKEN"
    assert c.credentials["api"].secret_file == "/etc/leviath/api.key"


def test_an_empty_file_is_a_config_with_every_section_unset() -> None:
    c = parse_config("", "config.toml")
    assert c == Config()
    assert c.sandbox is None
    assert c.resources == Resources()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (536870912, 536870912),
        ("512M", 512 * 1024**2),
        ("2G", 2 * 1024**3),
        ("1T", 1024**4),
        ("64K", 64 * 1024),
        ("100", 100),
        ("2g", 2 * 1024**3),
        ("infinity", None),
    ],
)
def test_memory_sizes_use_systemd_units_in_powers_of_1024(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["2X", "1.5G", "-1", "G", "", True, -5, 1.5])
def test_a_memory_size_systemd_would_not_accept_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize(("text", "expected"), [("150%", 150), ("50 %", 50), (200, 200)])
def test_cpu_quota_is_a_percentage_of_one_cpu(text: object, expected: int) -> None:
    assert parse_percent(text) == expected


@pytest.mark.parametrize("bad", ["150", "0%", "x%", 0, True])
def test_a_cpu_quota_without_percent_or_below_one_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_percent(bad)


def test_tasks_max_and_cpu_weight_take_systemds_ranges() -> None:
    assert Resources.model_validate({"tasks_max": "infinity"}).tasks_max is None
    for bad in ({"tasks_max": 0}, {"cpu_weight": 0}, {"cpu_weight": 10001}, {"tasks_max": "9"}):
        with pytest.raises(ValueError):
            Resources.model_validate(bad)


def test_booleans_and_numbers_are_not_coerced_from_strings() -> None:
    for text in (
        '[sandbox]\nnetwork = "no"\n',
        '[taint]\nbudget = "5"\n',
        "[sandbox]\ndefault_mounts = 0\n",
    ):
        with pytest.raises(ConfigError):
            parse_config(text, "c.toml")


def test_the_spec_example_blueprint_parses_with_its_stages_in_file_order() -> None:
    text = (FIXTURES / "blueprints" / "cto" / "blueprint.toml").read_text()
    bp = parse_blueprint(text, "blueprint.toml")
    assert isinstance(bp, Blueprint)
    assert bp.name == "cto"
    assert bp.agent.version == "1.0.0"
    assert list(bp.stages) == ["analyze", "plan", "review"]
    assert bp.read_paths.allow == ["~/.leviath/runs", "glob:~/design-docs/**"]
    assert bp.stages["review"].sandbox is not None
    assert bp.stages["review"].sandbox.network is False
    assert bp.seed.commands == [["git", "status", "--short"]]


def test_a_blueprint_needs_a_command_or_a_stage() -> None:
    with pytest.raises(ConfigError) as info:
        parse_blueprint('[agent]\nname = "x"\n', "bp.toml")
    assert "needs [agent] command or at least one [stages.NAME]" in str(info.value)
    parse_blueprint('[agent]\nname = "x"\ncommand = ["true"]\n', "bp.toml")
    parse_blueprint('[agent]\nname = "x"\n[stages.one]\ncommand = ["true"]\n', "bp.toml")


def test_a_credential_needs_a_command_and_exactly_one_secret_source() -> None:
    for text in (
        '[credentials.x]\ncommand = ["a"]\nenv = "X"\n',
        '[credentials.x]\ncommand = ["a"]\nenv = "X"\nsecret_file = "/k"\n'
        'secret_command = ["cat", "/k"]\n',
    ):
        with pytest.raises(ConfigError) as info:
            parse_config(text, "c.toml")
        assert "exactly one of secret_file or secret_command" in str(info.value)
    # `env` (the secret in the environment) is retired: parsed, refused at use.
    for text, missing in (
        ('[credentials.x]\nenv = "X"\nsecret_file = "/k"\n', "command"),
    ):
        with pytest.raises(ConfigError) as info:
            parse_config(text, "c.toml")
        assert f"credentials.x.{missing}" in str(info.value) or missing in str(info.value)
    ok = parse_config('[credentials.x]\ncommand = ["a"]\nsecret_file = "/k"\n', "c")
    assert ok.credentials["x"].secret_file == "/k"
    old = parse_config('[credentials.x]\ncommand = ["a"]\nenv = "X"\nsecret_file = "/k"\n', "c")
    assert old.credentials["x"].env == "X"


def test_models_are_immutable() -> None:
    c = parse_config('[sandbox]\nkind = "none"\n', "c.toml")
    with pytest.raises(ValueError):
        c.sandbox.kind = SandboxKind.CONTAINER  # type: ignore[union-attr, misc]


def test_enum_ranks_order_strictness() -> None:
    assert SandboxKind.NONE.rank < SandboxKind.NAMESPACE.rank < SandboxKind.CONTAINER.rank
    assert Permission.ALLOW.rank < Permission.ASK.rank < Permission.DENY.rank
    assert OnUnavailable.WARN.rank < OnUnavailable.ERROR.rank
    assert Sensitivity.PUBLIC.rank < Sensitivity.INTERNAL.rank < Sensitivity.PRIVATE.rank


# A name with a trailing newline: re.match with '$' let it pass (found by
# the safetext mutation sweep, the same pattern as here). Each field below is
# refused, in a machine config or a blueprint an agent may have written.
NEWLINE_NAMES = {
    "blueprint name": ('[agent]\nname = "x\\n"\ncommand = ["true"]\n', parse_blueprint),
    "env name": ('[agent]\nname = "x"\ncommand = ["true"]\n[env]\n"FOO\\n" = "1"\n',
                 parse_blueprint),
    "env_pass pattern": ('[security]\nenv_pass = ["LC_*\\n"]\n', parse_config),
    "credential host": ('[credentials.g]\nkind = "git"\nhosts = ["github.com\\n"]\n'
                        'secret_command = ["true"]\n', parse_config),
    "cli wrap name": ('[credentials.gh]\nkind = "cli"\ncommand = ["gh"]\ntoken_env = "GH_TOKEN"\n'
                      'wrap = "gh\\n"\nsecret_command = ["true"]\n', parse_config),
}


@pytest.mark.parametrize("field", sorted(NEWLINE_NAMES))
def test_a_name_with_a_trailing_newline_is_refused(field: str) -> None:
    text, parse = NEWLINE_NAMES[field]
    with pytest.raises(ConfigError):
        parse(text, "c.toml")
    # The same text without the newline loads: the refusal is the newline's.
    parse(text.replace("\\n\"", "\""), "c.toml")  # type: ignore[operator]
