"""`lev policy add/test/list` and `lev tool` argument forms."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from leviathd.broker.schema import args_from_positional
from leviathd.cli import policy as cli
from leviathd.errors import ConfigError, InvalidArgument


@pytest.fixture
def configs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    machine = tmp_path / "machine.toml"
    machine.write_text("[taint]\nenabled = true\n")
    monkeypatch.setenv("LEVIATH_CONFIG", str(machine))
    monkeypatch.setenv("LEVIATH_USER_CONFIG", str(tmp_path / "user" / "config.toml"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "user" / "config.toml"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_policy_add_appends_a_rule_keeping_the_rest_of_the_file(configs: Path) -> None:
    configs.parent.mkdir()
    configs.write_text("# my settings\n[tool_permissions]\nshell = \"ask\"\n")
    args = _parse(["policy", "add", "http_post", "--target", "*.example.com",
                   "--max-sensitivity", "private"])
    assert args.func(args) == 0
    text = configs.read_text()
    assert text.startswith("# my settings\n")
    assert '[[allowlist]]\ntool = "http_post"\ntarget = "*.example.com"' in text


def test_policy_add_refuses_a_catch_all_for_a_tool_that_sends_data_out_unless_forced(
    configs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 21 §8: `*` and `*.com` were taken silently.
    for target in ("*", "**"):
        args = _parse(["policy", "add", "http_post", "--target", target,
                       "--max-sensitivity", "private"])
        with pytest.raises(InvalidArgument, match="matches every target"):
            args.func(args)
    assert not configs.exists()
    args = _parse(["policy", "add", "http_post", "--target", "*", "--max-sensitivity",
                   "private", "--force"])
    assert args.func(args) == 0
    assert "warning" in capsys.readouterr().err
    args = _parse(["policy", "add", "http_get", "--target", "*.com", "--max-sensitivity",
                   "internal"])
    assert args.func(args) == 0
    assert "top-level domain" in capsys.readouterr().err
    args = _parse(["policy", "add", "http_get", "--target", "*.example.com",
                   "--max-sensitivity", "internal"])
    assert args.func(args) == 0
    assert capsys.readouterr().err == ""
    # A tool that sends nothing out may have one (it only matters above clearance).
    args = _parse(["policy", "add", "read_file", "--target", "*", "--max-sensitivity", "public"])
    assert args.func(args) == 0


def test_policy_add_refuses_an_edit_that_would_not_parse(configs: Path) -> None:
    configs.parent.mkdir()
    configs.write_text("[[allowlist]]\ntool = \"x\"\n")  # already broken: missing keys
    before = configs.read_text()
    args = _parse(["policy", "add", "http_post", "--target", "a", "--max-sensitivity", "public"])
    with pytest.raises(ConfigError):
        args.func(args)
    assert configs.read_text() == before


def test_policy_add_system_goes_through_the_daemon_and_never_writes_the_file_itself(
    configs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Even as root, the machine file is the daemon's to write (polkit decides
    # who may); with no bus to reach, nothing is written.
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/no-bus")
    machine = tmp_path / "machine.toml"
    before = machine.read_text()
    args = _parse(["policy", "add", "http_post", "--target", "a", "--max-sensitivity",
                   "public", "--system"])
    with pytest.raises(Exception, match="system bus"):
        args.func(args)
    assert machine.read_text() == before


def test_policy_test_prints_each_step_and_follows_the_allowlist(
    configs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _parse(["policy", "test", "http_post", "--target", "api.example.com",
                   "--taint", "private"])
    assert args.func(args) == 2  # ask
    out = capsys.readouterr().out
    assert "1. permission" in out and "on_exceed" in out and "decision: ASK" in out
    add = _parse(["policy", "add", "http_post", "--target", "*.example.com",
                  "--max-sensitivity", "private"])
    add.func(add)
    capsys.readouterr()
    assert args.func(args) == 0
    assert "decision: ALLOW (rule allowlist#1)" in capsys.readouterr().out


def test_policy_test_refuses_an_unknown_tool(configs: Path) -> None:
    args = _parse(["policy", "test", "teleport"])
    assert args.func(args) == 1


def test_tool_positional_arguments_map_to_the_schema() -> None:
    assert args_from_positional("read_file", ["a.txt"]) == {"path": "a.txt"}
    assert args_from_positional("read_files", ["a", "b"]) == {"paths": ["a", "b"]}
    assert args_from_positional("shell", ["ls", "-l"]) == {"command": "ls -l"}
    assert args_from_positional("credential", ["gh", "api", "x"]) == {"name": "gh",
                                                                      "args": ["api", "x"]}
    with pytest.raises(InvalidArgument):
        args_from_positional("read_file", ["a", "b"])


def test_policy_add_names_any_tool_with_a_note_when_it_is_not_built_in(
    configs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 14: the seed's own example failed with "unknown tool 'send_email'".
    args = _parse(["policy", "add", "send_email", "--target", "*.example.com",
                   "--max-sensitivity", "internal"])
    assert args.func(args) == 0
    assert 'tool = "send_email"' in configs.read_text()
    assert "not a built-in tool" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["send email", "x\nshell", "", "-rf", "a" * 200])
def test_policy_add_refuses_a_tool_name_that_is_not_one_token(configs: Path, bad: str) -> None:
    args = _parse(["policy", "add", "--target", "example.com", "--max-sensitivity", "internal",
                   "--", bad])
    with pytest.raises(InvalidArgument, match="tool name"):
        args.func(args)


def test_bash_is_the_shell_tool(configs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from leviathd.policy.allowlist import compile_allowlist
    from leviathd.policy.permissions import compile_permissions, permission_for

    table = compile_permissions({"bash": "ask"})
    assert permission_for("shell", table).permission == "ask"
    assert permission_for("bash", table).permission == "ask"
    rules = compile_allowlist([{"tool": "bash", "target": "git status",
                                "max_sensitivity": "private"}])
    assert rules.rules[0].tool == "shell"
    args = _parse(["policy", "add", "bash", "--target", "git status",
                   "--max-sensitivity", "private"])
    assert args.func(args) == 0
    assert 'tool = "shell"' in configs.read_text()
    capsys.readouterr()
    args = _parse(["policy", "test", "bash", "--target", "git status"])
    args.func(args)
    assert "unknown-tool" not in capsys.readouterr().out


BLUEPRINT_WITH_A_TOOL = """
[agent]
name = "bp"
command = ["true"]

[tools.upload]
argv = ["curl", "-d", "@-", "--", "{url}"]
sends_data = true

[tools.upload.arguments.properties.url]
type = "string"
"""


def test_policy_list_and_test_know_a_blueprints_own_tool(
    configs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bp").mkdir()
    (tmp_path / "bp" / "blueprint.toml").write_text(BLUEPRINT_WITH_A_TOOL)
    args = _parse(["policy", "list", "--blueprint", str(tmp_path / "bp")])
    assert args.func(args) == 0
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("upload"))
    assert row.split()[:3] == ["upload", "allow", "internal"]
    args = _parse(["policy", "test", "upload", "--target", "curl x", "--taint", "private",
                   "--blueprint", str(tmp_path / "bp")])
    assert args.func(args) == 2  # held: private above its clearance
    assert "blueprint tool" in capsys.readouterr().out
    # Without the blueprint, the name is nobody's tool.
    args = _parse(["policy", "test", "upload", "--target", "curl x"])
    assert args.func(args) == 1


def test_policy_add_rule_goes_to_the_users_config_and_never_allows(configs: Path) -> None:
    args = _parse(["policy", "add", "--rule", "careful", "--when", 'call.tool == "shell"',
                   "--decision", "ask", "--reason", "think first"])
    assert args.func(args) == 0
    assert 'name = "careful"' in configs.read_text()
    args = _parse(["policy", "add", "--rule", "loose", "--when", "true", "--decision", "allow"])
    with pytest.raises(InvalidArgument, match="never allow"):
        args.func(args)
    args = _parse(["policy", "add", "--rule", "x", "--decision", "deny"])
    with pytest.raises(InvalidArgument, match="--when"):
        args.func(args)
    args = _parse(["policy", "add", "http_post", "--rule", "x", "--when", "true",
                   "--decision", "deny"])
    with pytest.raises(InvalidArgument, match="not a tool"):
        args.func(args)
    assert "loose" not in configs.read_text()
