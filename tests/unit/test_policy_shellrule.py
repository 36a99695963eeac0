"""Shell allowlist rules (leviathd/policy/shellrule.py) from an agent's side:
lines built to look like an allowed command to the matcher while `sh` runs
something else. Each `False` below is a line that must not match its rule."""

from __future__ import annotations

import pytest

from leviathd.policy.shellrule import ShellPattern, parse_line


@pytest.mark.parametrize("rule, line, ok", [
    # The rule's words are globs over one word each: other commands are not it.
    ("git status *", "curl status", False),
    ("git status *", "git push --force", False),
    ("git status *", "git statusx", False),
    ("git status", "git status", True),
    ("git status --short", "git status --short", True),
    ("git st?tus", "git status", True),
    ("git st?tus", "git sttus", False),
    # A quote or an escape ends where sh ends it: what follows is read, not skipped.
    ("ls *", "ls 'a';id", False),
    ("ls *", "ls \\a;id", False),
    ("ls *", "ls 'a'b", True),
    ("ls *", "ls a\\ b", True),
    ("ls *", "ls '';id", False),
    ("echo *", "echo it\\'s", True),
    # Double quotes: one word, an escaped quote stays inside, an escaped
    # backslash does not escape the quote after it.
    ("git status *", 'git status "a; b"', True),
    ("git status *", 'git status "a"; id', False),
    ("git status *", 'git status "a\\"; id"', True),
    ("git status *", 'git status "a\\\\"; id', False),
    ("git status *", 'git status "a\\\\"', True),
    ("git status *", 'git status "unterminated', False),
    ("git status *", 'git status "unterminated\\"', False),
    ("git status *", 'git status "x"y;id', False),
    ("git status *", 'git status "a\\nb"', True),
    # A trailing backslash or a backslash-newline (a continuation) is refused.
    ("ls *", "ls \\", False),
    ("ls *", "ls \\\nid", False),
    ("ls *", "ls a\\\n;id", False),
    # A trailing `;` ends the line; a trailing `&` puts it in the background
    # (not the rule's shape); nothing at all is not a command.
    ("ls", "ls;", True),
    ("ls", "ls\n", True),
    ("ls", "ls &", False),
    ("ls | head", "ls | head &", False),
    ("ls", "", False),
    ("ls", ";", False),
    ("ls", "; ls", False),
    ("ls ; id", "ls ;; id", False),
    ("ls ; id", "ls ; id", True),
    ("ls && id", "ls && id", True),
    ("ls && id", "ls & & id", False),
])
def test_a_line_matches_a_shell_rule_only_as_sh_would_run_it(
    rule: str, line: str, ok: bool,
) -> None:
    assert ShellPattern(rule).matches(line) is ok, (rule, line)


def test_words_are_split_and_unquoted_as_sh_does() -> None:
    parsed = parse_line("git commit -m 'a b' \"c \\\"d\\\"\" e\\ f && ls\t-l")
    assert parsed is not None
    assert parsed.commands == (("git", "commit", "-m", "a b", 'c "d"', "e f"), ("ls", "-l"))
    assert parsed.operators == ("&&",)


def test_a_rule_with_an_operator_and_no_command_beside_it_is_refused() -> None:
    for rule in ("ls ;", "; ls", "ls && && id", "|"):
        with pytest.raises(ValueError):
            ShellPattern(rule)
