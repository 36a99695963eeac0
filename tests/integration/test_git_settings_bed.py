"""Issue 31 §5 from the attacker's side, in the test bed: git settings in the
(read-only) `.git/config` that name files in the workdir make those files
read-only inside the agent too.

Alice's repository is a husky one (`core.hooksPath = .husky`, its
pre-commit hook a harmless one) and includes `conf/extra.gitconfig`, which
sets a `core.fsmonitor` script in `tools/`. Her agent, in a namespace fence,
rewrites the hook, adds a post-commit hook, swaps the hooks folder and the
`tools` folder for its own, writes the included file and the fsmonitor
script; each fails, and at alice's next `git commit` and `git status` on the
host none of the agent's text runs, while her own hook does. Seen failing
before sandbox/gitsettings.py: the agent's pre-commit hook and fsmonitor ran
on the host (see the commit message)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator

import pytest
from testbed import Testbed

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    h = testbed.users["alice"].home
    old = testbed.run(["cat", "/etc/leviath/config.toml"], check=False).stdout
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.run(f"""
        set -e
        grep -q email {h}/.gitconfig 2>/dev/null || \
          printf '[user]\\n  name = Alice A\\n  email = alice@example.org\\n' >> {h}/.gitconfig
        mkdir -p {h}/gitset
    """, user="alice")  # fmt: skip
    yield testbed
    testbed.run(f"rm -rf {h}/gitset", check=False)
    testbed.write_file("/etc/leviath/config.toml", old)
    testbed.run(["systemctl", "restart", "leviathd"])


def _husky_repo(bed: Testbed) -> str:
    proj = f"{bed.users['alice'].home}/gitset/husky"
    bed.run(f"""
        set -e
        rm -rf {proj}; mkdir -p {proj}/.husky {proj}/conf {proj}/tools; cd {proj}
        git init -q -b main .
        printf '#!/bin/sh\\necho legit >> {proj}.legit\\n' > .husky/pre-commit
        chmod +x .husky/pre-commit
        printf '#!/bin/sh\\nexit 0\\n' > tools/fsmon
        chmod +x tools/fsmon
        printf '[core]\\n\\tfsmonitor = tools/fsmon\\n' > conf/extra.gitconfig
        git config core.hooksPath .husky
        git config include.path ../conf/extra.gitconfig
        echo one > file.txt
        git add -A
        git commit -q -m one
    """, user="alice")  # fmt: skip
    return proj


def _attacks(proj: str) -> str:
    pwn = f"#!/bin/sh\ntouch {proj}.PWNED-$(basename $0)\n"
    q = shlex.quote
    return f"""
t() {{
  name=$1; shift
  if ( "$@" ) >/dev/null 2>&1; then echo "$name ok"; else echo "$name refused"; fi
}}
pwn={q(pwn)}
t hook-rewrite sh -c 'printf %s "$1" > .husky/pre-commit' _ "$pwn"
t hook-new sh -c 'printf %s "$1" > .husky/post-commit && chmod +x .husky/post-commit' _ "$pwn"
t hooks-swap sh -c 'mv .husky .husky-old && mkdir .husky'
t hook-rm sh -c 'rm -f .husky/pre-commit'
t include-write sh -c 'printf "[core]\\n\\thooksPath = evil\\n" >> conf/extra.gitconfig'
t conf-swap sh -c 'mv conf conf-old && mkdir conf'
t fsmon-write sh -c 'printf %s "$1" > tools/fsmon' _ "$pwn"
t tools-swap sh -c 'mv tools tools-old && mkdir tools && printf %s "$1" > tools/fsmon \\
  && chmod +x tools/fsmon' _ "$pwn"
echo change >> file.txt && echo work ok
"""


def test_a_husky_hook_the_agent_rewrites_does_not_run_at_the_hosts_next_commit(
    bed: Testbed,
) -> None:
    proj = _husky_repo(bed)
    r = bed.run(["lev", "run", "--workdir", proj, "--", "sh", "-c", _attacks(proj)],
                user="alice", check=False)
    results = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines()
                   if line.endswith((" ok", " refused")))
    assert results.pop("work") == "ok", r.stdout + r.stderr
    assert results and set(results.values()) == {"refused"}, r.stdout + r.stderr
    # alice, on the host: a commit (her hook runs) and a status (the fsmonitor).
    bed.run(f"cd {proj} && git commit -q -am two && git status", user="alice")
    pwned = bed.run(f"ls {proj}.PWNED-* 2>/dev/null", check=False).stdout
    assert pwned == "", pwned
    assert "legit" in bed.read_file(f"{proj}.legit")
