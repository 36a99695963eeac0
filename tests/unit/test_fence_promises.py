"""The fence's lists, checked against names written here from the specs
(../shared/spec: what an agent never sees, which secrets never reach it),
never against the code's own tables: removing an entry from the code must
fail a test of its own (issue 19)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from broker_harness import call, running_broker

from leviathd.config.merge import Effective
from leviathd.config.models import SandboxKind
from leviathd.domain.mounts import MountRequest as ConfigMount
from leviathd.errors import InvalidArgument
from leviathd.gate.service import GateService
from leviathd.identity import UserInfo
from leviathd.policy.settings import PolicySettings
from leviathd.sandbox.environment import build_environment
from leviathd.sandbox.spec import RunRequest, SandboxSpec, build_spec

HOME = "/home/alice"
ALICE = UserInfo("alice", 1000, 1000, (1000,), HOME, "/bin/bash")

# What "Agents never see" lists, in the home folder...
NEVER_SEEN_IN_HOME = [
    ".ssh", ".gnupg", ".1password", ".config/op", ".config/gh", ".gitconfig",
    ".git-credentials", ".config/git/credentials", ".netrc", ".aws", ".azure", ".kube",
    ".docker", ".config/containers/auth.json", ".npmrc", ".pypirc", ".yarnrc.yml",
    ".cargo/credentials.toml", ".config/composer/auth.json", ".gradle/gradle.properties",
    ".m2/settings.xml", ".local/share/keyrings", ".password-store", ".config/leviath",
]  # fmt: skip
# ...and on the machine: engine sockets, the session bus, leviathd's own state.
NEVER_SEEN_ABSOLUTE = [
    "/run/user/1000", "/run/docker.sock", "/var/run/docker.sock", "/run/podman",
    "/run/containerd", "/run/dbus", "/etc/leviath", "/var/lib/leviath", "/run/leviath",
]  # fmt: skip
# Variables that never reach an agent, whatever a config passes.
NEVER_PASSED = [
    "GITHUB_TOKEN", "GH_TOKEN", "GITLAB_TOKEN", "OP_SERVICE_ACCOUNT_TOKEN", "OP_SESSION_my",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_CLIENT_SECRET",
    "ARM_CLIENT_SECRET", "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_AUTH_ACCESS_TOKEN",
    "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_AUTH_CONFIG", "CONTAINER_HOST",
    "REGISTRY_AUTH_FILE", "KUBECONFIG", "SSH_AUTH_SOCK", "SSH_AGENT_PID", "GPG_AGENT_INFO",
    "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR", "NPM_TOKEN", "NODE_AUTH_TOKEN",
    "PYPI_TOKEN", "TWINE_PASSWORD", "CARGO_REGISTRY_TOKEN", "COMPOSER_AUTH", "HF_TOKEN",
    "VAULT_TOKEN", "VAULT_ADDR", "GIT_ASKPASS", "SSH_ASKPASS", "MY_API_TOKEN",
    "DB_PASSWORD", "STRIPE_SECRET_KEY",
]  # fmt: skip


def spec_with_mount(path: str) -> SandboxSpec:
    effective = Effective(kind=SandboxKind.NAMESPACE, mounts=[ConfigMount(path=path)])
    return build_spec(
        effective, ALICE, RunRequest(("sh",), f"{HOME}/app"), "0123abcd",
        existing=lambda _p: True, links={"/bin": "usr/bin"},
    )  # fmt: skip


@pytest.mark.parametrize("rel", NEVER_SEEN_IN_HOME)
def test_a_mount_of_a_hidden_home_path_is_refused(rel: str) -> None:
    with pytest.raises(InvalidArgument, match="hidden"):
        spec_with_mount(f"{HOME}/{rel}")


@pytest.mark.parametrize("path", NEVER_SEEN_ABSOLUTE)
def test_a_mount_of_a_hidden_machine_path_is_refused(path: str) -> None:
    with pytest.raises(InvalidArgument, match="hidden"):
        spec_with_mount(path)


@pytest.mark.parametrize("name", NEVER_PASSED)
def test_a_secret_variable_never_passes_even_with_everything_passed(name: str) -> None:
    env = build_environment({name: "planted", "PATH": "/usr/bin"}, ALICE, env_pass=["*"])
    assert name not in env


# -- the broker: hidden paths win over every grant --------------------------


@pytest.fixture
def home_tree(tmp_path: Path) -> dict[str, Path]:
    home, work = tmp_path / "home", tmp_path / "home" / "work"
    (home / ".config" / "gh").mkdir(parents=True)
    (home / ".config" / "gh" / "hosts.yml").write_text("oauth_token: gho_planted\n")
    (home / ".config" / "app.toml").write_text("ok = true\n")
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    work.mkdir()
    (work / ".env").write_text("SECRET=planted\n")
    (work / "env-link").symlink_to(work / ".env")
    return {"home": home, "work": work, "tmp": tmp_path}


def read_through_broker(tree: dict[str, Path], settings: PolicySettings, path: str) -> Any:
    with running_broker(home=str(tree["home"]), workdir=str(tree["work"]), settings=settings,
                        socket_path=str(tree["tmp"] / "broker.sock")) as running:  # fmt: skip
        return call(running.path, "read_file", {"path": path})


def test_a_granted_folder_does_not_open_the_built_in_hidden_paths_inside_it(
    home_tree: dict[str, Path],
) -> None:
    settings = PolicySettings(read_paths=["~/.config", "~/.ssh"], taint_enabled=True)
    granted = read_through_broker(home_tree, settings, str(home_tree["home"] / ".config/app.toml"))
    assert granted["ok"], granted  # the grant itself works...
    for target in (".config/gh/hosts.yml", ".ssh/id_ed25519"):  # ...but not for these
        reply = read_through_broker(home_tree, settings, str(home_tree["home"] / target))
        assert not reply["ok"], (target, reply)
        assert "planted" not in str(reply) and "PRIVATE" not in str(reply)


def test_a_workdir_link_to_a_configured_hidden_file_is_not_served(
    home_tree: dict[str, Path],
) -> None:
    hidden = str(home_tree["work"] / ".env")
    settings = PolicySettings(hidden_paths=[hidden], taint_enabled=True)
    for path in ("env-link", ".env"):
        reply = read_through_broker(home_tree, settings, path)
        assert not reply["ok"], (path, reply)
        assert "planted" not in str(reply)


# -- the gate: a peer's cgroup maps to an agent only through its own unit ----


def test_a_cgroup_of_another_unit_ending_in_an_agents_id_is_not_that_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEVIATH_RUNTIME_DIR", str(tmp_path / "run"))
    agents: Any = object()
    gate = GateService(agents, state_dir=str(tmp_path))
    unit = "leviath-alice-claude-0123abcd.scope"
    rec = SimpleNamespace(running=True, unit=unit)
    gate.live["0123abcd"] = SimpleNamespace(rec=rec)  # type: ignore[assignment]
    assert gate.lookup(f"/leviath.slice/{unit}") == "0123abcd"
    mallory = "/user.slice/user-1002.slice/user@1002.service/app.slice"
    assert gate.lookup(f"{mallory}/leviath-mallory-x-0123abcd.scope") is None
    assert gate.lookup("/leviath.slice/leviath-bob-claude-0123abcd.scope") is None
