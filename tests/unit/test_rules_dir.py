"""Issue 15 §1: machine rules in rules.d beside the machine config
(config/load.py load_machine): root's files only, in name order after the
config's own [[rules]], names unique, links not followed; and the edit that
`lev policy add --rule --system` makes through the daemon (config/edit.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from leviathd.config.edit import ADDED_RULES_FILE, add_machine_rule, append_user_rule
from leviathd.config.load import load_config, load_machine
from leviathd.errors import ConfigError, InvalidArgument

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root owns machine rules")


def rule(name: str, decision: str = "deny") -> str:
    return (f'\n[[rules]]\nname = "{name}"\nwhen = \'call.tool == "shell"\'\n'
            f'decision = "{decision}"\n')


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    (tmp_path / "config.toml").write_text(rule("own"))
    (tmp_path / "rules.d").mkdir(mode=0o755)
    os.chmod(tmp_path / "rules.d", 0o755)
    return tmp_path


def names(etc: Path) -> list[str]:
    return [r.name for r in load_machine(etc / "config.toml").rules]


def test_rules_d_files_follow_the_config_in_name_order(etc: Path) -> None:
    (etc / "rules.d" / "20-b.toml").write_text(rule("b"))
    (etc / "rules.d" / "10-a.toml").write_text(rule("a") + rule("a2", "ask"))
    (etc / "rules.d" / "notes.txt").write_text("not rules")
    (etc / "rules.d" / ".hidden.toml").write_text(rule("hidden"))
    assert names(etc) == ["own", "a", "a2", "b"]
    assert [r.name for r in load_config(etc / "config.toml").rules] == ["own"]
    (etc / "config.toml").unlink()
    assert names(etc) == ["a", "a2", "b"]


@pytest.mark.parametrize("spoil, why", [
    (lambda d: os.chown(d / "10-a.toml", 1000, -1), "not root"),
    (lambda d: os.chmod(d / "10-a.toml", 0o664), "writable by group"),
    (lambda d: os.chmod(d, 0o777), "writable by group"),
    (lambda d: os.chown(d, 1000, -1), "not root"),
    (lambda d: (d / "30-link.toml").symlink_to(d / "10-a.toml"), "symbolic link"),
    (lambda d: (d / "40-bad.toml").write_text("[[rules]]\nname = 'x'\nwhen = '1 +'\n"
                                               "decision = 'deny'\n"), "40-bad.toml:"),
    (lambda d: (d / "50-dup.toml").write_text(rule("own")), "already defined"),
    (lambda d: (d / "60-other.toml").write_text("[sandbox]\nkind = 'none'\n"), "sandbox"),
])
def test_a_rules_d_that_is_not_roots_alone_or_bad_is_refused_whole(
    etc: Path, spoil: object, why: str
) -> None:
    folder = etc / "rules.d"
    (folder / "10-a.toml").write_text(rule("a"))
    os.chmod(folder / "10-a.toml", 0o644)
    spoil(folder)  # type: ignore[operator]
    with pytest.raises(ConfigError, match=why):
        load_machine(etc / "config.toml")


def test_a_linked_rules_d_is_refused(etc: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    other = tmp_path_factory.mktemp("elsewhere")
    (etc / "rules.d").rmdir()
    (etc / "rules.d").symlink_to(other)
    with pytest.raises(ConfigError, match="a link is not followed"):
        load_machine(etc / "config.toml")


def test_add_machine_rule_appends_checks_and_refuses(etc: Path) -> None:
    where = add_machine_rule(etc / "config.toml", "added", 'call.tool == "http_post"', "allow",
                             'a "quoted" reason')
    assert where == etc / "rules.d" / ADDED_RULES_FILE
    assert names(etc) == ["own", "added"]
    assert load_machine(etc / "config.toml").rules[-1].reason == 'a "quoted" reason'
    assert oct(where.stat().st_mode & 0o777) == "0o644"
    for name, when, exc in [("added", "true", "already defined"), ("own", "true", "already"),
                            ("bad", "call.tool = 1", "does not compile"),
                            ("bad name", "true", "not a valid name")]:
        before = where.read_text()
        with pytest.raises((ConfigError, InvalidArgument), match=exc):
            add_machine_rule(etc / "config.toml", name, when, "deny", "")
        assert where.read_text() == before
    where.unlink()
    where.symlink_to(etc / "config.toml")
    with pytest.raises(InvalidArgument, match="not a regular file"):
        add_machine_rule(etc / "config.toml", "x", "true", "deny", "")


def test_a_users_rule_goes_to_her_config(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("# mine\n")
    append_user_rule(path, "careful", 'call.tool == "shell"', "ask", "")
    assert path.read_text().startswith("# mine\n")
    assert [r.name for r in load_config(path).rules] == ["careful"]
    with pytest.raises(InvalidArgument, match="already there"):
        append_user_rule(path, "careful", "true", "deny", "")
