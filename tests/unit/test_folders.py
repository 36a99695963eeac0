"""`[[folders]]` (issue 33 item 4, the Legato spec's resources): a folder for
one installed agent, for every agent in one repository, or for that agent in
that repository, merged from the configs and kept by the spec only where it
applies; a hidden one is refused."""

from __future__ import annotations

import pytest

from leviathd.config.load import parse_config
from leviathd.config.merge import resolve
from leviathd.config.models import Config
from leviathd.errors import ConfigError, InvalidArgument
from leviathd.identity import UserInfo
from leviathd.sandbox.spec import RunRequest, SandboxSpec, build_spec

HOME = "/home/alice"
ALICE = UserInfo("alice", 1000, 1000, (1000,), HOME, "/bin/bash")

USER = parse_config("""
[[folders]]
path = "~/specs"
agent = "a"
repository = "~/r"

[[folders]]
path = "~/out"
access = "write"
agent = "a"

[[folders]]
path = "/srv/data"
repository = "~/r"
""", "user config")


def spec(agent: str, workdir: str, user: Config = USER) -> SandboxSpec:
    eff = resolve(Config(), user, None, agent).agent
    return build_spec(eff, ALICE, RunRequest((agent,), workdir), "0123abcd",
                      existing=lambda _p: True)


def shown(s: SandboxSpec) -> dict[str, bool]:
    return {m.target: m.readonly for m in s.mounts
            if m.kind == "bind" and m.why.startswith("folder for")}


def test_agent_a_in_the_repository_gets_both_of_its_folders_and_the_repositorys() -> None:
    assert shown(spec("a", f"{HOME}/r")) == {
        f"{HOME}/specs": True, f"{HOME}/out": False, "/srv/data": True}
    assert shown(spec("a", f"{HOME}/r/sub/dir"))[f"{HOME}/specs"] is True


def test_agent_a_elsewhere_gets_only_its_own_folder() -> None:
    assert shown(spec("a", f"{HOME}/other")) == {f"{HOME}/out": False}
    assert shown(spec("a", f"{HOME}/rr")) == {f"{HOME}/out": False}  # not a prefix match


def test_agent_b_in_the_repository_gets_only_the_repositorys() -> None:
    assert shown(spec("b", f"{HOME}/r")) == {"/srv/data": True}


def test_a_folder_inside_a_hidden_path_is_refused() -> None:
    user = parse_config('[[folders]]\npath = "~/.ssh/keys"\nagent = "a"\n', "user config")
    with pytest.raises(InvalidArgument, match="hidden path"):
        spec("a", f"{HOME}/r", user)


def test_the_whole_home_is_refused() -> None:
    user = parse_config('[[folders]]\npath = "~"\nagent = "a"\n', "user config")
    with pytest.raises(InvalidArgument, match="whole home"):
        spec("a", f"{HOME}/r", user)


def test_a_folder_for_nobody_is_refused_by_the_model() -> None:
    with pytest.raises(ConfigError, match="names the agent or the repository"):
        parse_config('[[folders]]\npath = "~/x"\n', "user config")


def test_a_folder_grant_of_proc_is_refused() -> None:
    user = parse_config('[[folders]]\npath = "/proc"\nagent = "a"\n', "user config")
    with pytest.raises(InvalidArgument, match="kernel"):
        spec("a", f"{HOME}/r", user)
