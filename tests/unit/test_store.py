"""The agent store and `lev add` / `lev list`: atomic installs, no silent overwrite,
nothing on disk changed by a command that failed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from leviathd.cli.main import main
from leviathd.config.agent_store import blueprint_folder, install, list_installed
from leviathd.config.load import agent_store_path, user_config_path
from leviathd.errors import ConfigError, InvalidArgument, NotFound
from leviathd.paths import machine_config_path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CTO = FIXTURES / "blueprints" / "cto"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LEVIATH_CONFIG", str(tmp_path / "etc-config.toml"))
    monkeypatch.setenv("LEVIATH_USER_CONFIG", str(FIXTURES / "configs" / "cto-user.toml"))
    monkeypatch.setenv("LEVIATH_AGENT_STORE", str(tmp_path / "data" / "agents"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file and folder under root, with file contents: to prove nothing changed."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = Path(p).read_bytes() if not os.path.islink(p) else b"@"
    return out


def make_blueprint(where: Path, name: str = "demo", extra: str = "") -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "blueprint.toml").write_text(
        f'[agent]\nname = "{name}"\nversion = "2.0"\ncommand = ["run"]\n{extra}'
    )
    return where


def test_paths_default_to_the_shared_names_and_follow_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("LEVIATH_CONFIG", "LEVIATH_USER_CONFIG", "LEVIATH_AGENT_STORE"):
        monkeypatch.delenv(var, raising=False)
    assert machine_config_path() == Path("/etc/leviath/config.toml")
    assert user_config_path("/home/bob") == Path("/home/bob/.config/leviath/config.toml")
    assert agent_store_path("/home/bob") == Path("/home/bob/.local/share/leviath/agents")
    monkeypatch.setenv("LEVIATH_CONFIG", "/x/c.toml")
    monkeypatch.setenv("LEVIATH_USER_CONFIG", "/x/u.toml")
    monkeypatch.setenv("LEVIATH_AGENT_STORE", "/x/agents")
    assert machine_config_path() == Path("/x/c.toml")
    assert user_config_path("/home/bob") == Path("/x/u.toml")
    assert agent_store_path() == Path("/x/agents")


def test_install_copies_the_folder_under_the_agents_name(env: Path) -> None:
    src = make_blueprint(env / "src" / "anything", "demo")
    (src / "prompt.md").write_text("hello")
    dest, bp = install(src)
    assert dest == env / "data" / "agents" / "demo"
    assert (dest / "prompt.md").read_text() == "hello"
    assert bp.agent.name == "demo"
    # No temporary folders are left in the store.
    assert sorted(p.name for p in dest.parent.iterdir()) == ["demo"]


def test_an_installed_agent_is_not_replaced_without_force(env: Path) -> None:
    install(make_blueprint(env / "v1", "demo"))
    before = snapshot(env / "data")
    v2 = make_blueprint(env / "v2", "demo", '[env]\nV = "2"\n')
    with pytest.raises(InvalidArgument, match=r"already installed.*use --force"):
        install(v2)
    assert snapshot(env / "data") == before
    dest, bp = install(v2, force=True)
    assert bp.env == {"V": "2"}
    assert 'V = "2"' in (dest / "blueprint.toml").read_text()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["demo"]


def test_an_invalid_blueprint_changes_nothing_on_disk_not_even_the_store_folder(
    env: Path,
) -> None:
    bad = make_blueprint(env / "bad", "bad", '[sandbox]\nkind = "vm"\n')
    before = snapshot(env)
    with pytest.raises(ConfigError, match=r"sandbox.kind"):
        install(bad)
    assert snapshot(env) == before
    assert not (env / "data").exists()


def test_a_copy_that_fails_half_way_leaves_no_trace(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_blueprint(env / "src", "demo")
    (src / "big.bin").write_bytes(b"x" * 4096)
    real_copytree = shutil.copytree

    def disk_full(source: Path, target: Path, **kw: object) -> object:
        real_copytree(source, target, **kw)  # type: ignore[arg-type]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("leviathd.config.agent_store.shutil.copytree", disk_full)
    with pytest.raises(InvalidArgument, match=r"cannot install into .*No space left on device"):
        install(src)
    assert not (env / "data").exists()


def test_a_failed_replace_keeps_the_installed_version(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(make_blueprint(env / "v1", "demo"))
    before = snapshot(env / "data")
    real_copytree = shutil.copytree

    def disk_full(source: Path, target: Path, **kw: object) -> object:
        real_copytree(source, target, **kw)  # type: ignore[arg-type]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("leviathd.config.agent_store.shutil.copytree", disk_full)
    with pytest.raises(InvalidArgument):
        install(make_blueprint(env / "v2", "demo", '[env]\nV = "2"\n'), force=True)
    assert snapshot(env / "data") == before


def test_a_symlink_in_a_blueprint_folder_is_copied_as_a_link_not_its_target(env: Path) -> None:
    secret = env / "home" / ".ssh" / "id_rsa"
    secret.parent.mkdir(parents=True)
    secret.write_text("PRIVATE KEY")
    src = make_blueprint(env / "src", "demo")
    (src / "key").symlink_to(secret)
    dest, _ = install(src)
    assert (dest / "key").is_symlink()


def test_the_blueprint_argument_is_a_folder_a_file_or_an_installed_name(env: Path) -> None:
    src = make_blueprint(env / "src", "demo")
    assert blueprint_folder(str(src)) == src
    assert blueprint_folder(str(src / "blueprint.toml")) == src
    dest, _ = install(src)
    assert blueprint_folder("demo") == dest
    with pytest.raises(NotFound, match=r"neither a folder with blueprint.toml nor an agent"):
        blueprint_folder("other")
    with pytest.raises(NotFound, match=r"no blueprint.toml in this folder"):
        blueprint_folder(str(env))


def test_list_shows_broken_agents_instead_of_hiding_them(env: Path) -> None:
    install(make_blueprint(env / "ok", "ok"))
    broken = env / "data" / "agents" / "broken"
    broken.mkdir()
    (broken / "blueprint.toml").write_text("[agent\n")
    (env / "data" / "agents" / ".demo.new-x").mkdir()  # an interrupted install
    agents = list_installed()
    assert [a.name for a in agents] == ["broken", "ok"]
    assert agents[0].blueprint is None and "not valid TOML" in (agents[0].error or "")


def test_lev_list_marks_a_broken_agent_with_its_error(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = env / "data" / "agents" / "broken"
    broken.mkdir(parents=True)
    (broken / "blueprint.toml").write_text("[agent]\n")
    assert main(["list"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "broken  (broken)",
        f"  {broken}/blueprint.toml:1: agent.name: required key is missing",
    ]


def test_lev_add_prints_the_validate_status_of_what_it_installed(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["add", str(CTO)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"Installed 'cto' into {env / 'data' / 'agents' / 'cto'}"
    assert out[1:3] == ["✓ Blueprint 'cto' is valid.", "  3 stages, version 1.0.0"]
    assert "[read-paths-not-granted]" in out[3]
    assert main(["add", str(CTO)]) == 1
    assert "use --force" in capsys.readouterr().err
    assert main(["add", str(CTO), "--force"]) == 0


def test_lev_add_of_an_invalid_blueprint_fails_and_installs_nothing(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = make_blueprint(env / "bad", "bad", '[permissions]\nshell = "sometimes"\n')
    assert main(["add", str(bad)]) == 1
    assert "permissions.shell: must be 'allow', 'ask' or 'deny'" in capsys.readouterr().err
    assert not (env / "data").exists()


def test_lev_list_shows_granted_over_declared_under_each_agent(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["list"]) == 0
    assert capsys.readouterr().out == "No agents installed. Install one with: lev add PATH\n"
    shutil.copytree(CTO, env / "data" / "agents" / "cto")
    install(make_blueprint(env / "plain", "plain"))
    assert main(["list"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "cto  1.0.0  3 stages  Plans the next piece of work from past runs and the design docs",
        "  reads outside the workdir: 1/2 granted (not granted: glob:~/design-docs/**)",
        "plain  2.0  0 stages",
    ]
    assert main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["cto", "plain"]
    assert rows[0]["read_paths"] == {
        "declared": ["~/.leviath/runs", "glob:~/design-docs/**"],
        "granted": ["~/.leviath/runs"],
    }
