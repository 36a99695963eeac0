"""Issue 31 §5: what git settings in a protected config name inside the
workdir is read-only too (pure: the spec with every host answer passed in;
the bed side is tests/integration/test_git_settings_bed.py). Before
sandbox/gitsettings.py none of these targets was protected (seen failing)."""

from __future__ import annotations

from test_protected import protected
from test_sandbox_spec import HOME, WORKDIR, spec_for

from leviathd.sandbox.gitsettings import named_paths, parse

CONFIG = f"""
[core]
\trepositoryformatversion = 0
\thooksPath = .husky
\tfsmonitor = "tools/fsmon.sh"   ; a comment
\tsshCommand = ssh -F ./ssh/config
\teditor = true
[include]
\tpath = ../shared.gitconfig
[includeIf "gitdir:{WORKDIR}/"]
\tpath = {WORKDIR}/conf/more.gitconfig
[filter "lfs"]
\tsmudge = ./bin/smudge %f
[diff "img"]
\ttextconv = scripts/tc
[merge "ours"]
\tdriver = ./bin/merge %O %A %B
[alias]
\tst = status
\tx = "!./bin/alias-x"
[sequence]
\teditor = ./bin/seq-editor
"""

MORE = """
[core]
\tpager = ./bin/pager
"""


def test_the_parser_reads_sections_subsections_quotes_and_comments() -> None:
    got = parse(CONFIG)
    assert ("core", "hookspath", ".husky") in got
    assert ("core", "fsmonitor", "tools/fsmon.sh") in got
    assert ("filter.lfs", "smudge", "./bin/smudge %f") in got
    assert ("alias", "x", "!./bin/alias-x") in got
    assert ("includeif.gitdir:" + WORKDIR + "/", "path", f"{WORKDIR}/conf/more.gitconfig") in got


def test_every_covered_setting_names_its_target() -> None:
    files = {f"{WORKDIR}/.git/config": CONFIG, f"{WORKDIR}/conf/more.gitconfig": MORE}
    named = {n.path: n for n in named_paths([f"{WORKDIR}/.git/config"], home=HOME,
                                            top=WORKDIR, read_text=files.get)}
    for rel in ("tools/fsmon.sh", "ssh/config", "bin/smudge", "scripts/tc", "bin/merge",
                "bin/alias-x", "bin/seq-editor", "conf/more.gitconfig", "bin/pager"):
        assert f"{WORKDIR}/{rel}" in named, rel
    assert named[f"{WORKDIR}/.husky"].folder
    assert f"{WORKDIR}/shared.gitconfig" in named  # relative to the including file (.git/)
    assert not any(p.endswith("/status") or p.endswith("/true") for p in named)


def test_a_husky_hooks_folder_and_what_the_config_names_are_read_only_in_the_spec() -> None:
    p = protected(spec_for(files={f"{WORKDIR}/.git/config": CONFIG,
                                  f"{WORKDIR}/conf/more.gitconfig": MORE}))
    assert p[f"{WORKDIR}/.husky"] == (True, "dir")
    for rel in ("tools/fsmon.sh", "bin/smudge", "bin/merge", "conf/more.gitconfig",
                "bin/pager"):
        assert p[f"{WORKDIR}/{rel}"] == (True, "file"), rel


def test_the_users_gitconfig_counts_too_but_never_the_workdir_itself() -> None:
    home_config = "[core]\n\thooksPath = .\n[core]\n\tfsmonitor = ./watch\n"
    p = protected(spec_for(files={f"{HOME}/.gitconfig": home_config}))
    assert WORKDIR not in p or p[WORKDIR][0] is False
    assert p[f"{WORKDIR}/watch"] == (True, "file")


def test_a_boolean_fsmonitor_names_nothing() -> None:
    named = named_paths(["c"], home=HOME, top=WORKDIR,
                        read_text={"c": "[core]\n\tfsmonitor = true\n"}.get)
    assert named == []


def test_the_folders_above_a_named_target_are_pinned_up_to_the_workdir() -> None:
    config = "[core]\n\thooksPath = tools/git/hooks\n"
    p = protected(spec_for(files={f"{WORKDIR}/.git/config": config}))
    assert p[f"{WORKDIR}/tools/git/hooks"] == (True, "dir")
    assert p[f"{WORKDIR}/tools/git"] == (False, "dir")
    assert p[f"{WORKDIR}/tools"] == (False, "dir")
