"""Loading config files and blueprints from disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from leviathd.config.load import (
    ConfigTooLarge,
    blueprint_file,
    load_blueprint,
    load_config,
    load_configs,
    parse_blueprint,
    parse_config,
)
from leviathd.config.models import Config, SandboxKind
from leviathd.domain.workdir import refuse_system_workdir
from leviathd.errors import ConfigError, InvalidArgument, NotFound


def test_a_missing_config_file_means_every_default_unless_it_was_asked_for(
    tmp_path: Path,
) -> None:
    assert load_config(tmp_path / "absent.toml") == Config()
    with pytest.raises(NotFound, match=r"absent\.toml: no such file"):
        load_config(tmp_path / "absent.toml", missing_ok=False)


def test_load_configs_reads_the_machine_and_the_users_file_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = tmp_path / "machine.toml"
    machine.write_text('[sandbox]\nkind = "container"\n')
    monkeypatch.setenv("LEVIATH_CONFIG", str(machine))
    monkeypatch.setenv("LEVIATH_USER_CONFIG", str(tmp_path / "none.toml"))
    m, u = load_configs()
    assert m.sandbox is not None and m.sandbox.kind is SandboxKind.CONTAINER
    assert u is None
    user = tmp_path / "user.toml"
    user.write_text("[sandbox]\nnetwork = false\n")
    monkeypatch.setenv("LEVIATH_USER_CONFIG", str(user))
    _, u = load_configs()
    assert u is not None and u.sandbox is not None and u.sandbox.network is False


def test_the_error_names_the_file_that_was_read(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[security]\nread_paths = [\n  \"~/ok\",\n  \"regex:.*\",\n]\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:2: security.read_paths[1]: 'regex:.*'")


def test_a_blueprint_loads_from_its_folder_or_its_file(tmp_path: Path) -> None:
    (tmp_path / "blueprint.toml").write_text('[agent]\nname = "x"\ncommand = ["true"]\n')
    assert blueprint_file(tmp_path) == tmp_path / "blueprint.toml"
    assert load_blueprint(tmp_path).agent.name == "x"
    assert load_blueprint(tmp_path / "blueprint.toml").agent.name == "x"
    with pytest.raises(NotFound, match=r"expected a folder with blueprint\.toml"):
        load_blueprint(tmp_path / "sub")


# --- bounds before parsing (issue 22) ---------------------------------------------


def _stages(n: int) -> str:
    stages = "".join(f'[stages.s{i}]\ncommand = ["true"]\n' for i in range(n))
    return '[agent]\nname = "x"\n' + stages


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (_stages(65), r"65 stages \(at most 64\)"),
        ("# x\n" * (70 * 1024), "larger than 256 KiB"),
        ("é" * (130 * 1024), "larger than 256 KiB"),  # 2 bytes each: counted in bytes
        ('[agent]\nname = "x"\ncommand = ["t"]\nx = ' + "[" * 100_000 + "]" * 100_000,
         "nested deeper than 16 levels"),
        ('[agent]\nname = "x"\ncommand = ["t"]\nx = ' + "{a = " * 20 + "1" + "}" * 20,
         "nested deeper than 16 levels"),
        ('[agent]\nname = "x"\n[seed]\ncommands = [' + '["t"],' * 65 + "]\n[stages.a]\n"
         'command = ["t"]\n', r"65 seed commands \(at most 64\)"),
        ('[sandbox]\nmounts = [' + '{path = "/srv"},' * 129 + "]\n", r"129 mounts"),
        ("x = [" + "1," * 20_001 + "]\n", "more than 20000 values"),
    ],
)  # fmt: skip
def test_oversized_texts_are_refused_with_the_bound_they_break(text: str, why: str) -> None:
    with pytest.raises(ConfigTooLarge, match=why):
        parse_blueprint(text, "bp.toml")


def test_texts_at_the_bounds_still_parse() -> None:
    assert len(parse_blueprint(_stages(64), "bp.toml").stages) == 64
    assert parse_config("[sandbox]\nmounts = [" + '{path = "/srv"},' * 128 + "]\n", "c") is not None


@pytest.mark.parametrize("path", ["/", "/etc", "/etc/", "/usr/lib", "//etc", "/var", "/var/lib/x",
                                  "/proc/1", "/run/user/1000", "/root", "/dev/shm"])  # fmt: skip
def test_system_folders_are_never_a_workdir(path: str) -> None:
    with pytest.raises(InvalidArgument, match="system folder"):
        refuse_system_workdir(path)


@pytest.mark.parametrize("path", ["/home/alice/p", "/srv/data", "/tmp/x", "/var/tmp/x", "/opt/p",
                                  "/etcetera", "/variable"])  # fmt: skip
def test_other_folders_may_be_a_workdir(path: str) -> None:
    refuse_system_workdir(path)


def test_a_folder_in_the_callers_own_home_is_allowed_even_under_a_system_folder() -> None:
    refuse_system_workdir("/root/proj", "/root")
    with pytest.raises(InvalidArgument, match="system folder"):
        refuse_system_workdir("/root", "/root")  # the whole home is not a project
    with pytest.raises(InvalidArgument, match="system folder"):
        refuse_system_workdir("/root/proj", "/home/alice")
    with pytest.raises(InvalidArgument, match="system folder"):
        refuse_system_workdir("/etc/x", "/")
