"""`lev folder remove` (config/edit.py remove_folders): the [[folders]]
tables of one folder leave the user's config; every other table, comment and
line stays as it was, and a layout the edit cannot follow is refused whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from leviathd.config.edit import remove_folders
from leviathd.errors import InvalidArgument

TEXT = """\
# my config
[sandbox]
kind = "namespace"

[[folders]]  # specs for a
path = "~/specs"
agent = "a"

[[folders]]
path = "~/specs"
agent = "b"
repository = "~/r"

[[folders]]
path = "~/out"
access = "write"
agent = "a"

[taint]
enabled = true
"""


def test_only_the_named_folders_tables_go(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(TEXT)
    new, gone = remove_folders(cfg, "~/specs", "b", None)
    assert [(g.path, g.agent, g.repository) for g in gone] == [("~/specs", "b", "~/r")]
    assert new == TEXT.replace('[[folders]]\npath = "~/specs"\nagent = "b"\n'
                               'repository = "~/r"\n\n', "")
    new, gone = remove_folders(cfg, "~/specs", None, None)
    assert [g.agent for g in gone] == ["a", "b"]
    assert "# my config" in new and '"~/out"' in new and "[taint]" in new
    assert "~/specs" not in new
    new, gone = remove_folders(cfg, "~/nothing", None, None)
    assert gone == [] and new == TEXT


def test_a_layout_the_edit_cannot_follow_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "config.toml"
    # A line inside a multi-line string that looks like a header.
    cfg.write_text('[[folders]]\npath = "~/x"\nagent = "a"\n\n[[rules]]\nname = "r"\n'
                   'when = """\n[[folders]]\ntrue"""\ndecision = "allow"\n')
    with pytest.raises(Exception) as got:
        remove_folders(cfg, "~/x", None, None)
    assert isinstance(got.value, InvalidArgument)
