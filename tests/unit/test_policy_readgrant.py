"""The gate's fast index gives the same answers as the read-path engine."""

from __future__ import annotations

import random

from leviathd.policy.readgrant import build_index, index_key, literal_prefix
from leviathd.readpatterns import compile_grants, may_read, may_write


def test_literal_prefix_stops_at_the_first_non_literal() -> None:
    assert literal_prefix(r"/home/u/docs(?:/[^/]+)*") == "/home/u/docs"
    assert literal_prefix(r"/data/ab?c") == "/data/a"
    assert literal_prefix(r"/a|/b") == ""
    assert literal_prefix(r"/x\.y\d") == "/x.y"


def test_index_keys_are_directories_every_match_lies_in() -> None:
    assert index_key(r"/home/u/docs(?:/[^/]+)*/[^/]*\.md") == "/home/u/docs"
    assert index_key(r"/home/u/docs(?:/[^/]+)*") == "/home/u/docs"
    assert index_key(r"/data/run[^/]*/x") == "/data"
    assert index_key(r"/archive/a1/[0-9]+/.*") == "/archive/a1"
    assert index_key(r"(/a|/b)/.*") is None


def test_the_index_agrees_with_may_read_on_generated_paths() -> None:
    rng = random.Random(11)
    home, work = "/home/u", "/srv/w"
    patterns = ["~/notes", "../shared", "glob:~/docs/**/*.md", "glob:/data/*/runs",
                "glob:~/docs/**", "glob:/data/q/**/runs", "regex:/data/q(/.*)?",
                "regex:/archive/[0-9]+/.*", "regex:~/mail/.*\\.txt", "glob:**/specs",
                "/opt/x", "regex:/(data|opt)/x/.*", "regex:/a\\.b/[0-9]+", "glob:/d/*"]
    hidden = ["~/notes/private", "/srv/w/private"]
    grants = compile_grants(patterns, home=home, workdir=work, hidden=hidden)
    index = build_index(patterns, home=home, workdir=work, hidden=hidden)
    parts = ["home", "u", "notes", "private", "docs", "a.md", "data", "q", "runs", "archive",
             "12", "mail", "m.txt", "srv", "shared", "w", "specs", "opt", "x", "..", ".",
             "a.b", "d", "7"]
    for _ in range(5000):
        path = "/" + "/".join(rng.choice(parts) for _ in range(rng.randint(0, 6)))
        assert index.may_read(path) == may_read(path, grants), path
        assert index.may_write(path) == may_write(path, grants), path


def test_an_agent_cannot_write_into_a_hidden_path_of_its_workdir_nor_around_it() -> None:
    index = build_index(["glob:/srv/**"], home="/home/u", workdir="/srv/w",
                        hidden=["/srv/w/.git/hooks"])
    assert index.may_write("/srv/w/src/x.py")
    for path in ("/srv/w/.git/hooks/pre-commit", "/srv/w/.git/hooks",
                 "/srv/w/src/../.git/hooks/pre-commit", "/srv/w/./.git/hooks/x",
                 "//srv/w/.git/hooks/x", "/srv/w/x/", "srv/w/x", "/srv/other/x"):
        assert not index.may_write(path), path
        # a read grant over all of /srv does not open the hidden path either
        assert not index.may_read(path) or path == "/srv/other/x", path


def test_an_index_over_no_grants_is_inactive() -> None:
    assert not build_index([], home="/home/u", workdir="/srv/w").active
    assert build_index(["/opt/x"], home="/home/u", workdir="/srv/w").active
