"""The gate's fast index gives the same answers as the read-path engine."""

from __future__ import annotations

import random

from leviathd.policy.readgrant import build_index, index_key, literal_prefix
from leviathd.readpatterns import compile_grants, may_read


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
                "/opt/x"]
    grants = compile_grants(patterns, home=home, workdir=work, hidden=["~/notes/private"])
    index = build_index(patterns, home=home, workdir=work, hidden=["~/notes/private"])
    parts = ["home", "u", "notes", "private", "docs", "a.md", "data", "q", "runs", "archive",
             "12", "mail", "m.txt", "srv", "shared", "w", "specs", "opt", "x", "..", "."]
    for _ in range(5000):
        path = "/" + "/".join(rng.choice(parts) for _ in range(rng.randint(0, 6)))
        assert index.may_read(path) == may_read(path, grants), path


def test_an_index_over_no_grants_is_inactive() -> None:
    assert not build_index([], home="/home/u", workdir="/srv/w").active
