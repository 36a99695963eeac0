"""Loading config files and blueprints from disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from leviathd.config.load import blueprint_file, load_blueprint, load_config, load_configs
from leviathd.config.models import Config, SandboxKind
from leviathd.errors import ConfigError, NotFound


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
