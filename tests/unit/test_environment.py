"""The agent's environment: built from an allowlist, withholding always wins."""

from __future__ import annotations

import pytest

from leviathd.errors import InvalidArgument
from leviathd.identity import UserInfo
from leviathd.sandbox.environment import build_environment, parse_git_identity

ALICE = UserInfo("alice", 1000, 1000, (1000,), "/home/alice", "/bin/zsh")

CALLER = {
    "PATH": "/home/alice/.local/bin:/usr/bin",
    "LANG": "en_GB.UTF-8",
    "LC_ALL": "en_GB.UTF-8",
    "TERM": "xterm-256color",
    "EDITOR": "vim",
    "GITHUB_TOKEN": "ghp_secret",
    "GH_TOKEN": "gho_secret",
    "OP_SERVICE_ACCOUNT_TOKEN": "ops_secret",
    "AWS_ACCESS_KEY_ID": "AKIA",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "AZURE_CLIENT_SECRET": "secret",
    "GOOGLE_APPLICATION_CREDENTIALS": "/home/alice/gcp.json",
    "DOCKER_HOST": "unix:///run/user/1000/docker.sock",
    "SSH_AUTH_SOCK": "/run/user/1000/ssh",
    "NPM_TOKEN": "npm_secret",
    "MY_SERVICE_TOKEN": "x",
    "DB_PASSWORD": "x",
    "STRIPE_SECRET_KEY": "x",
    "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1000/bus",
    "XDG_RUNTIME_DIR": "/run/user/1000",
    "HOME": "/tmp/not-alice",
    "USER": "mallory",
    "SOMETHING_ELSE": "1",
}

SECRETS = (
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "OP_SERVICE_ACCOUNT_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AZURE_CLIENT_SECRET",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "DOCKER_HOST",
    "SSH_AUTH_SOCK",
    "NPM_TOKEN",
    "MY_SERVICE_TOKEN",
    "DB_PASSWORD",
    "STRIPE_SECRET_KEY",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
)


def test_only_allowlisted_variables_pass_from_the_caller() -> None:
    env = build_environment(CALLER, ALICE)
    for name in ("PATH", "LANG", "LC_ALL", "TERM", "EDITOR"):
        assert env[name] == CALLER[name]
    assert "SOMETHING_ELSE" not in env
    for name in SECRETS:
        assert name not in env, name


def test_secret_variables_stay_out_even_when_config_passes_everything() -> None:
    env = build_environment(CALLER, ALICE, env_pass=["*"])
    assert env["SOMETHING_ELSE"] == "1"
    for name in SECRETS:
        assert name not in env, name


def test_config_can_pass_more_names_and_withhold_allowed_ones() -> None:
    env = build_environment(
        CALLER | {"ANTHROPIC_API_KEY": "k"},
        ALICE,
        env_pass=["ANTHROPIC_API_KEY", "SOMETHING_*"],
        env_withhold=["EDITOR"],
    )
    assert env["ANTHROPIC_API_KEY"] == "k" and env["SOMETHING_ELSE"] == "1"
    assert "EDITOR" not in env


def test_identity_comes_from_the_account_not_the_caller() -> None:
    env = build_environment(CALLER, ALICE)
    assert (env["HOME"], env["USER"], env["LOGNAME"], env["SHELL"]) == (
        "/home/alice", "alice", "alice", "/bin/zsh"
    )


def test_a_missing_path_gets_a_plain_default() -> None:
    assert build_environment({}, ALICE)["PATH"] == "/usr/local/bin:/usr/bin:/bin"


def test_git_name_and_email_arrive_since_gitconfig_is_hidden() -> None:
    env = build_environment({}, ALICE, git_identity={"name": "Alice A", "email": "a@x.org"})
    assert env["GIT_AUTHOR_NAME"] == env["GIT_COMMITTER_NAME"] == "Alice A"
    assert env["GIT_AUTHOR_EMAIL"] == env["GIT_COMMITTER_EMAIL"] == "a@x.org"


def test_a_blueprint_adds_variables_but_never_a_withheld_one() -> None:
    env = build_environment({}, ALICE, blueprint_env={"MODE": "plan", "PATH": "/opt/x:/usr/bin"})
    assert env["MODE"] == "plan" and env["PATH"] == "/opt/x:/usr/bin"
    with pytest.raises(InvalidArgument, match="GITHUB_TOKEN"):
        build_environment({}, ALICE, blueprint_env={"GITHUB_TOKEN": "x"})
    with pytest.raises(InvalidArgument, match="DEPLOY_KEY"):
        build_environment({}, ALICE, env_withhold=["DEPLOY_KEY"], blueprint_env={"DEPLOY_KEY": "x"})
    with pytest.raises(InvalidArgument, match="HOME"):
        build_environment({}, ALICE, blueprint_env={"HOME": "/"})


def test_git_identity_is_read_from_the_user_section_only() -> None:
    text = """
# comment
[core]
    name = not-this
[user]
    name = "Alice Example"   # trailing comment
    email = alice@example.org
[include]
    path = ~/.gitconfig.secret
"""
    assert parse_git_identity(text) == {"name": "Alice Example", "email": "alice@example.org"}
    assert parse_git_identity("[core]\n  editor = vim\n") == {}
