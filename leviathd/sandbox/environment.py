"""The environment an agent starts with, from an allowlist.

Shared by every launcher (none, namespace, container): a variable reaches the
agent only when it is allowed (built-in names or config `env_pass`) and not
withheld (built-in names and patterns or config `env_withhold`). Withholding
always wins, so a config that passes `*` still never leaks `GITHUB_TOKEN`.
Identity variables come from the password database, never from the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

from leviathd.errors import InvalidArgument
from leviathd.identity import UserInfo

# Names (or fnmatch patterns) a caller's variable may keep.
ALLOWED: tuple[str, ...] = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TERM",
    "COLORTERM",
    "TZ",
    "EDITOR",
    "VISUAL",
    "PAGER",
    "LESS",
    "MANPAGER",
    "NO_COLOR",
    "FORCE_COLOR",
    "CLICOLOR",
    "CLICOLOR_FORCE",
    "COLUMNS",
    "LINES",
)

# Names (or fnmatch patterns) that never reach an agent, whatever config passes.
WITHHELD: tuple[str, ...] = (
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "GH_ENTERPRISE_TOKEN",
    "GITLAB_TOKEN",
    "OP_SERVICE_ACCOUNT_TOKEN",
    "OP_CONNECT_TOKEN",
    "OP_SESSION_*",
    "AWS_*",
    "AZURE_*",
    "ARM_CLIENT_SECRET",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_KEYFILE_JSON",
    "CLOUDSDK_AUTH_*",
    "DOCKER_HOST",
    "DOCKER_AUTH_CONFIG",
    "DOCKER_CONFIG",
    "CONTAINER_HOST",
    "REGISTRY_AUTH_FILE",
    "KUBECONFIG",
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
    "GPG_AGENT_INFO",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
    "NPM_TOKEN",
    "NODE_AUTH_TOKEN",
    "YARN_NPM_AUTH_TOKEN",
    "PYPI_TOKEN",
    "TWINE_PASSWORD",
    "TWINE_USERNAME",
    "CARGO_REGISTRY_TOKEN",
    "CARGO_REGISTRIES_*_TOKEN",
    "GRADLE_OPTS",
    "MAVEN_OPTS",
    "COMPOSER_AUTH",
    "HF_TOKEN",
    "VAULT_TOKEN",
    "VAULT_ADDR",
    "GIT_ASKPASS",
    "SSH_ASKPASS",
    "*_TOKEN",
    "*_SECRET*",
    "*_PASSWORD",
    "*_PASSWD",
    "*_CREDENTIALS",
)

# Set from the password database; neither the caller nor a blueprint decides them.
IDENTITY_NAMES: tuple[str, ...] = ("HOME", "USER", "LOGNAME", "SHELL")

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in patterns)


def is_withheld(name: str, extra_withhold: Iterable[str] = ()) -> bool:
    return _matches(name, WITHHELD) or _matches(name, extra_withhold)


def is_allowed(name: str, extra_pass: Iterable[str] = ()) -> bool:
    return _matches(name, ALLOWED) or _matches(name, extra_pass)


def build_environment(
    caller_env: Mapping[str, str],
    user: UserInfo,
    *,
    env_pass: Iterable[str] = (),
    env_withhold: Iterable[str] = (),
    blueprint_env: Mapping[str, str] | None = None,
    git_identity: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The agent's environment.

    `caller_env` is what the person who asked for the run had; `git_identity`
    holds `name`/`email` from their ~/.gitconfig (read by the caller, as the
    user), and becomes GIT_AUTHOR_*/GIT_COMMITTER_* since the file itself is
    hidden. Raises InvalidArgument when a blueprint sets a withheld or identity
    variable: that is an author's mistake worth a clear message, not a silent drop.
    """
    passes = tuple(env_pass)
    withholds = tuple(env_withhold)
    env: dict[str, str] = {}
    for name, value in caller_env.items():
        if name in IDENTITY_NAMES or is_withheld(name, withholds):
            continue
        if is_allowed(name, passes):
            env[name] = value
    env.setdefault("PATH", DEFAULT_PATH)

    if git_identity:
        git_name = git_identity.get("name")
        email = git_identity.get("email")
        if git_name:
            env["GIT_AUTHOR_NAME"] = env["GIT_COMMITTER_NAME"] = git_name
        if email:
            env["GIT_AUTHOR_EMAIL"] = env["GIT_COMMITTER_EMAIL"] = email

    for name, value in (blueprint_env or {}).items():
        if is_withheld(name, withholds):
            raise InvalidArgument(
                f"the blueprint sets {name}, which is withheld from agents; "
                "secrets reach an agent through a credential, not [env]"
            )
        if name in IDENTITY_NAMES:
            raise InvalidArgument(f"the blueprint sets {name}, which comes from the user's account")
        env[name] = value

    env["HOME"] = user.home
    env["USER"] = user.name
    env["LOGNAME"] = user.name
    env["SHELL"] = user.shell
    return env


def parse_git_identity(gitconfig_text: str) -> dict[str, str]:
    """`name` and `email` from the [user] section of a gitconfig's text.

    A small reader on purpose: we only want two keys and must never run git
    (which would honour include paths and hooks) as root on a user's file.
    """
    identity: dict[str, str] = {}
    section = ""
    for raw in gitconfig_text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line[1:].split("]", 1)[0].strip().lower()
            continue
        if section != "user" or "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip().lower()
        value = value.split(" #", 1)[0].split(" ;", 1)[0].strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        if key in ("name", "email") and value:
            identity[key] = value
    return identity
