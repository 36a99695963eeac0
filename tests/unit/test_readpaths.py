"""Table tests for every read-path pattern rule of leviath-security.md."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from leviathd.errors import AccessDenied, InvalidArgument
from leviathd.readpatterns import (
    PatternKind,
    ReadPathError,
    active_patterns,
    compile_grants,
    compile_pattern,
    fd_real_path,
    may_read,
    may_write,
    normalize_pattern,
    open_for_read,
    parse_pattern,
    real_path,
)

HOME = "/home/alice"
WORKDIR = "/home/alice/src/proj"


def grants_for(*patterns: str, hidden: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    g = compile_grants(patterns, home=HOME, workdir=WORKDIR, hidden=hidden)
    assert not g.rejected, g.rejected
    return g


# (pattern, path, readable?) -- every rule of the spec, one row each.
MATCHES = [
    # exact paths grant their subtree
    ("~/.leviath/runs", "/home/alice/.leviath/runs", True),
    ("~/.leviath/runs", "/home/alice/.leviath/runs/2024/log.txt", True),
    ("~/.leviath/runs", "/home/alice/.leviath/runs-old/log.txt", False),
    ("~/.leviath/runs", "/home/alice/.leviath", False),
    ("/data/runs", "/data/runs/a", True),
    ("/data/runs/", "/data/runs/a", True),
    # relative entries resolve against the workdir
    ("../shared-docs", "/home/alice/src/shared-docs/spec.md", True),
    ("../shared-docs", "/home/alice/shared-docs/spec.md", False),
    ("../../notes", "/home/alice/notes/x", True),
    ("./../shared-docs", "/home/alice/src/shared-docs", True),
    # ~ is the agent user's home
    ("~/notes", "/root/notes/x", False),
    ("~/notes", "/home/alice/notes/x", True),
    # glob: * stays within one component
    ("glob:~/docs/*.md", "/home/alice/docs/a.md", True),
    ("glob:~/docs/*.md", "/home/alice/docs/sub/a.md", False),
    ("glob:~/docs/*.md", "/home/alice/docs/a.txt", False),
    ("glob:/data/*/logs", "/data/web/logs", True),
    ("glob:/data/*/logs", "/data/web/x/logs", False),
    ("glob:/data/log?.txt", "/data/log1.txt", True),
    ("glob:/data/log?.txt", "/data/log12.txt", False),
    # glob: ** crosses components, and matches the folder itself
    ("glob:~/design-docs/**", "/home/alice/design-docs", True),
    ("glob:~/design-docs/**", "/home/alice/design-docs/a/b/c.md", True),
    ("glob:~/design-docs/**", "/home/alice/design-docs-x/a", False),
    ("glob:/srv/**/README", "/srv/README", True),
    ("glob:/srv/**/README", "/srv/a/b/README", True),
    ("glob:/srv/**/README", "/srv/a/b/README.md", False),
    # a relative glob's leading run is folded into the workdir
    ("glob:../shared/*.md", "/home/alice/src/shared/a.md", True),
    ("glob:../shared/*.md", "/home/alice/src/proj/shared/a.md", True),  # inside the workdir
    ("glob:../shared/*.md", "/home/alice/src/other/a.md", False),
    # glob metacharacters of other dialects are literal
    ("glob:/data/[ab]", "/data/[ab]", True),
    ("glob:/data/[ab]", "/data/a", False),
    # regex: anchored and absolute
    ("regex:/data/archives/.*", "/data/archives/2024/x.tar", True),
    ("regex:/data/archives/.*", "/data/archives", False),
    ("regex:/data/runs", "/data/runs", True),
    ("regex:/data/runs", "/data/runs-anything", False),
    ("regex:/data/runs", "/data/runs/x", False),
    ("regex:/data/runs", "/x/data/runs", False),
    ("regex:~/archive/[0-9]+/.*", "/home/alice/archive/12/a", True),
    ("regex:~/archive/[0-9]+/.*", "/home/alice/archive/ab/a", False),
    # a drive letter parses (a blueprint written on Windows) and never matches here
    ("regex:C:/data/.*", "/data/x", False),
]


@pytest.mark.parametrize(("pattern", "path", "readable"), MATCHES)
def test_each_pattern_form_matches_exactly_the_paths_the_spec_says(
    pattern: str, path: str, readable: bool
) -> None:
    assert may_read(path, grants_for(pattern)) is readable


REFUSED = [
    ("regex:.*", "must be absolute"),
    ("regex:data/.*", "must be absolute"),
    ("regex:/.*", "whole file system or the whole home"),
    ("regex:~/.*", "whole file system or the whole home"),
    ("regex:/(etc|root|proc|var|zz-probe)/.*", "whole file system"),
    ("regex:/data/(", "not a valid regular expression"),
    ("glob:/**", "whole file system"),
    ("glob:/*/**", "whole file system"),
    ("glob:~/**", "whole home"),
    ("/", "whole file system"),
    ("~", "whole home"),
    ("~/", "whole home"),
    ("glob:~/docs/../.ssh/*", "may not contain '.' or '..'"),
    ("glob:/data/./x", "may not contain '.' or '..'"),
    ("glob:docs/../../x", "may not contain '.' or '..'"),
    ("/data/../etc", "may not contain '.' or '..'"),
    ("~/a/./b", "may not contain '.' or '..'"),
    ("glob:/data/a**b", "'**' must be a whole path component"),
    ("glob:/data//x", "empty path component"),
    ("~bob/notes", "only '~/'"),
    ("glob:~bob/*", "only '~/'"),
    ("~/docs/*.md", "write glob:~/docs/*.md"),
    ("", "empty"),
    (" /data", "leading or trailing spaces"),
    ("glob:", "empty glob"),
    ("glob:../../../../../../../../../../../../**", "whole file system"),
]


@pytest.mark.parametrize(("pattern", "message"), REFUSED)
def test_malformed_and_catch_all_patterns_are_refused_when_parsed(
    pattern: str, message: str
) -> None:
    with pytest.raises(ReadPathError) as info:
        parse_pattern(pattern)
    assert message in str(info.value)
    # A person reads it: it is one of the project's error types.
    assert isinstance(info.value, InvalidArgument)


def test_pattern_kinds_and_relative_entries_are_recognised() -> None:
    assert parse_pattern("~/x").kind is PatternKind.EXACT
    assert parse_pattern("../x").relative
    assert not parse_pattern("/x").relative
    assert parse_pattern("glob:x/*").relative
    assert parse_pattern("regex:/x").kind is PatternKind.REGEX


def test_a_relative_entry_that_climbs_to_the_root_is_refused_for_that_workdir() -> None:
    g = compile_grants(["../../../../.."], home=HOME, workdir="/a/b/c")
    assert g.patterns == ()
    assert "whole file system" in g.rejected[0][1]
    assert not may_read("/etc/shadow", g)


def test_a_regex_spelling_out_the_users_home_is_refused_when_bound_to_that_home() -> None:
    with pytest.raises(ReadPathError):
        compile_pattern("regex:/home/alice/.*", home=HOME, workdir=WORKDIR)


def test_trailing_slashes_do_not_make_a_different_pattern() -> None:
    assert normalize_pattern("~/runs/") == normalize_pattern("~/runs") == "~/runs"
    assert normalize_pattern("glob:~/d/**/") == "glob:~/d/**"


def test_the_workdir_is_always_readable_and_nothing_else_without_a_grant() -> None:
    g = grants_for()
    assert may_read(WORKDIR, g)
    assert may_read(WORKDIR + "/src/main.py", g)
    assert not may_read("/home/alice/src/proj-other/x", g)
    assert not may_read("/home/alice/.ssh/id_ed25519", g)
    assert not may_read("/etc/passwd", g)


def test_paths_not_in_real_form_are_refused_rather_than_guessed_at() -> None:
    g = grants_for("~/runs")
    for path in ("runs/x", WORKDIR + "/../../../.ssh/id", WORKDIR + "/./x", "//etc", ""):
        assert not may_read(path, g), path


def test_writing_never_leaves_the_workdir_whatever_is_granted() -> None:
    g = grants_for("~/runs", "glob:~/docs/**", "regex:/data/.*")
    assert may_write(WORKDIR + "/out.txt", g)
    for path in ("/home/alice/runs/x", "/home/alice/docs/a", "/data/x"):
        assert may_read(path, g)
        assert not may_write(path, g)


def test_hidden_paths_are_refused_even_inside_the_workdir_or_a_grant() -> None:
    g = compile_grants(
        ["~/stuff"], home=HOME, workdir=HOME, hidden=["~/.ssh", "/home/alice/stuff/keys"]
    )
    assert may_read("/home/alice/notes.txt", g)
    assert not may_read("/home/alice/.ssh/id_rsa", g)
    assert not may_write("/home/alice/.ssh/authorized_keys", g)
    assert not may_read("/home/alice/stuff/keys/a", g)
    assert may_read("/home/alice/stuff/other", g)


# ------------------------------------------------------------ declared and granted


def test_a_grant_counts_only_for_patterns_the_blueprint_declares() -> None:
    declared = ["~/.leviath/runs", "glob:~/design-docs/**"]
    assert active_patterns(declared, ["~/.leviath/runs", "/etc"]) == ["~/.leviath/runs"]
    assert active_patterns(["~/a"], ["~/a", "~/b"]) == ["~/a"]
    assert active_patterns([], ["~/a"]) == []


def test_grants_compare_patterns_not_paths() -> None:
    # A grant of a parent folder does not activate a declared sub-folder: the
    # declared-and-granted check compares the patterns as written.
    assert active_patterns(["~/a/b"], ["~/a"]) == []
    assert active_patterns(["~/a/b/"], ["~/a/b"]) == ["~/a/b/"]


def test_allow_blueprint_read_paths_grants_every_valid_declaration() -> None:
    assert active_patterns(["~/a", "glob:~/b/*"], [], allow_all=True) == ["~/a", "glob:~/b/*"]
    assert active_patterns(["regex:.*", "~/a"], [], allow_all=True) == ["~/a"]


# ------------------------------------------------------------ real files, real fds


def test_open_for_read_checks_the_descriptor_and_refuses_a_planted_symlink(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("secret")
    granted = home / "design-docs"
    granted.mkdir()
    (granted / "ok.md").write_text("fine")
    (granted / "keys").symlink_to(home / ".ssh" / "id_rsa")
    workdir = home / "proj"
    workdir.mkdir()
    g = compile_grants(["glob:~/design-docs/**"], home=str(home), workdir=str(workdir))

    fd = open_for_read(str(granted / "ok.md"), g)
    try:
        assert os.read(fd, 10) == b"fine"
        assert fd_real_path(fd) == str(granted / "ok.md")
    finally:
        os.close(fd)
    with pytest.raises(AccessDenied):
        open_for_read(str(granted / "keys"), g)
    with pytest.raises(AccessDenied):
        open_for_read(str(home / ".ssh" / "id_rsa"), g)


def test_open_for_read_refuses_a_fifo_even_where_granted(tmp_path: Path) -> None:
    workdir = tmp_path / "w"
    workdir.mkdir()
    os.mkfifo(workdir / "pipe")
    g = compile_grants([], home=str(tmp_path), workdir=str(workdir))
    with pytest.raises(AccessDenied):
        open_for_read("pipe", g)  # relative paths are taken against the workdir


def test_real_path_resolves_relative_paths_against_the_workdir(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "link").symlink_to(tmp_path)
    assert real_path("link", workdir=str(tmp_path / "w")) == str(tmp_path)
