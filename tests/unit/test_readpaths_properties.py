"""Property tests: a path is readable only inside the workdir or through a pattern both
declared and granted, and symlinks made for real on disk never widen a grant."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from leviathd.errors import AccessDenied
from leviathd.readpatterns import (
    ReadPathError,
    active_patterns,
    compile_grants,
    compile_pattern,
    fd_real_path,
    is_inside,
    may_read,
    open_for_read,
    parse_pattern,
)

HOME = "/home/u"
WORKDIR = "/home/u/w"

names = st.sampled_from(["a", "b", "docs", ".ssh", "runs", "x.md", "w", "u", "home", "data"])
abs_paths = st.lists(names, min_size=0, max_size=5).map(lambda parts: "/" + "/".join(parts))
home_paths = st.lists(names, min_size=0, max_size=4).map(lambda p: "/".join([HOME, *p]))
any_path = st.one_of(abs_paths, home_paths, home_paths.map(lambda p: p.replace(HOME, WORKDIR)))

component = st.one_of(names, st.sampled_from(["*", "**", "?", "*.md", "d*"]))
pattern_body = st.lists(component, min_size=1, max_size=4).map("/".join)
patterns = st.one_of(
    pattern_body.map(lambda b: "~/" + b),
    pattern_body.map(lambda b: "/" + b),
    pattern_body.map(lambda b: "glob:~/" + b),
    pattern_body.map(lambda b: "glob:/" + b),
    pattern_body.map(lambda b: "glob:../" + b),
    pattern_body.map(lambda b: "../" + b),
    pattern_body.map(lambda b: "regex:/" + b.replace("**", ".*").replace("*", "[^/]*")),
    pattern_body.map(lambda b: "regex:~/" + b.replace("**", ".*").replace("*", "[^/]*")),
)


def _valid(items: list[str]) -> list[str]:
    """The patterns the engine accepts: some are refused only once compiled
    against the workdir (a relative glob that covers the whole home)."""
    out = []
    for p in items:
        try:
            parse_pattern(p)
            compile_pattern(p, home=HOME, workdir=WORKDIR)
        except ReadPathError:
            continue
        out.append(p)
    return out


@given(
    declared=st.lists(patterns, max_size=4),
    granted=st.lists(patterns, max_size=4),
    path=any_path,
)
@example(declared=["../docs"], granted=["../docs/"], path="/home/u/docs/x.md")
@example(declared=["glob:~/docs/*.md"], granted=["~/docs"], path="/home/u/docs/x.md")
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_a_path_is_readable_only_inside_the_workdir_or_through_a_declared_and_granted_pattern(
    declared: list[str], granted: list[str], path: str
) -> None:
    declared, granted = _valid(declared), _valid(granted)
    active = active_patterns(declared, granted)
    g = compile_grants(active, home=HOME, workdir=WORKDIR)
    if may_read(path, g):
        inside = is_inside(path, WORKDIR)
        # Independent check: the pattern that lets it through is both declared and
        # granted, and matches on its own.
        via = [
            p
            for p in declared
            if p in active
            and any(parse_pattern(p).text == parse_pattern(q).text for q in granted)
            and compile_pattern(p, home=HOME, workdir=WORKDIR).matches(path)
        ]
        assert inside or via, (path, declared, granted)


@given(declared=st.lists(patterns, max_size=4), path=any_path)
@settings(max_examples=200)
def test_declared_patterns_without_any_grant_open_nothing_outside_the_workdir(
    declared: list[str], path: str
) -> None:
    g = compile_grants(active_patterns(_valid(declared), []), home=HOME, workdir=WORKDIR)
    assert may_read(path, g) == is_inside(path, WORKDIR)


@given(granted=st.lists(patterns, max_size=4), path=any_path)
@settings(max_examples=200)
def test_grants_alone_open_nothing_outside_the_workdir(granted: list[str], path: str) -> None:
    g = compile_grants(active_patterns([], _valid(granted)), home=HOME, workdir=WORKDIR)
    assert may_read(path, g) == is_inside(path, WORKDIR)


# ------------------------------------------------------------------ real symlinks

# A tree: home/{w (workdir), granted/, secret/}. Hypothesis plants symlinks in the
# workdir and the granted folder pointing anywhere in the tree (or outside it) and asks,
# for each path reachable through them, whether its real path may be read.
LINK_TARGETS = [
    "secret",
    "secret/key",
    "granted",
    "granted/doc.md",
    "w",
    "w/own.txt",
    "..",
    "../..",
    "granted/../secret",
    "/etc",
    "/etc/passwd",
    "granted/sub",
]


def _build(root: Path) -> None:
    for d in ("home/w", "home/granted/sub", "home/secret", "home/.ssh"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "home/secret/key").write_text("k")
    (root / "home/.ssh/id_rsa").write_text("k")
    (root / "home/granted/doc.md").write_text("d")
    (root / "home/granted/sub/x").write_text("x")
    (root / "home/w/own.txt").write_text("o")


def _physically_allowed(root: Path) -> set[str]:
    """Every file or folder that truly lives in the workdir or the granted folder,
    found without following any symlink: the oracle."""
    out: set[str] = set()
    real_root = os.path.realpath(root)
    for top in ("home/w", "home/granted"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(real_root, top)):
            out.add(dirpath)
            for n in dirnames + filenames:
                p = os.path.join(dirpath, n)
                if not os.path.islink(p):
                    out.add(p)
    return out


@given(
    links=st.lists(
        st.tuples(
            st.sampled_from(["home/w", "home/granted", "home/granted/sub"]),
            st.sampled_from(LINK_TARGETS),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
    )
)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_symlinks_made_for_real_never_widen_a_grant(links: list[tuple[str, str, bool]]) -> None:
    root = Path(tempfile.mkdtemp(prefix="lev-links-"))
    try:
        _build(root)
        home = root / "home"
        for i, (where, target, absolute) in enumerate(links):
            dest = (home / target) if absolute and not target.startswith("/") else Path(target)
            link = root / where / f"l{i}"
            link.symlink_to(dest)
        g = compile_grants(
            active_patterns(["~/granted"], ["~/granted"]), home=str(home), workdir=str(home / "w")
        )
        allowed = _physically_allowed(root)
        secret = os.path.realpath(home / "secret")
        for where in ("home/w", "home/granted", "home/granted/sub"):
            for entry in os.listdir(root / where):
                for suffix in ("", "/key", "/id_rsa", "/doc.md", "/x", "/.ssh/id_rsa"):
                    # The path as the agent names it, links and all: the check itself
                    # must resolve it, on the descriptor it opened.
                    candidate = str(root / where / entry) + suffix
                    try:
                        fd = open_for_read(candidate, g, directory=os.path.isdir(candidate))
                    except (AccessDenied, OSError):
                        continue
                    try:
                        real = fd_real_path(fd)
                    finally:
                        os.close(fd)
                    assert real in allowed, (candidate, real)
                    assert not is_inside(real, secret), candidate
    finally:
        shutil.rmtree(root)
