"""Issue 48 §1-3 from the attacker's side, in the test bed: what git itself
says it reads and runs is read-only inside the agent, and nothing the agent
writes runs at alice's next ordinary git commands on the host.

Alice's repository `proj` has two linked worktrees, `wta` and `wtb`; it is
a husky 9 one (`core.hooksPath = .husky/_`, whose runner runs
`.husky/<hook>`: a stand-in for husky's own `_/h`, which is not installed
here); its `.git/config` is over 64 KiB, then sets a `!f() { ./x; }; f`
alias, a `remote.<name>.uploadpack` and a `difftool.<tool>.cmd`. Her
`~/.gitconfig` is a link into `~/.config/stow/` (a dotfiles manager's; the
link's target is hidden as the link is, but the script its alias runs was
not protected), and the machine config gives agents `~/.config` to write. A second repository,
`mono`, is a monorepo whose `core.hooksPath = frontend/.husky/_`; its agent
works in `mono/frontend`.

The agent in `wta` rewrites the husky hook, the alias's, uploadpack's and
difftool's scripts, the linked global config and the script it names,
`~/.config/git/config`, and `wtb`'s `commondir` (to a git folder of its own
with a `core.fsmonitor`); the agent in `mono/frontend` rewrites its husky
hook. Each is refused; alice then commits, runs her alias, fetches, runs the
difftool and `git status` in `wtb` and in `mono`: nothing of the agents'
runs, her own hooks do. Seen failing on the code before issue 48 (the
commit message lists which)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator

import pytest
from testbed import Testbed

pytestmark = pytest.mark.testbed

CONFIG = """[sandbox]
kind = "namespace"
mounts = [{ path = "~/.config", access = "write" }]
"""

# husky 9's `_/<hook>` runs `.husky/<hook>` (a stand-in for its `_/h`)
RUNNER = ('#!/bin/sh\nn=$(basename "$0")\nd=$(dirname "$(dirname "$0")")\n'
          '[ -f "$d/$n" ] && exec sh -e "$d/$n"\nexit 0\n')


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    h = testbed.users["alice"].home
    old = testbed.run(["cat", "/etc/leviath/config.toml"], check=False).stdout
    old_gitconfig = testbed.run(f"cat {h}/.gitconfig", user="alice", check=False).stdout
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.run(f"""
        set -e
        rm -rf {h}/told {h}/.gitconfig {h}/.config/stow; mkdir -p {h}/told {h}/.config/stow/bin
        g={h}/.config/stow/gitconfig
        printf '[user]\\n  name = Alice A\\n  email = alice@example.org\\n' > $g
        printf '[alias]\\n\\tdt = "!$HOME/.config/stow/bin/dt.sh"\\n' >> $g
        printf '#!/bin/sh\\necho legit-dt >> {h}/told/legit\\n' > {h}/.config/stow/bin/dt.sh
        chmod +x {h}/.config/stow/bin/dt.sh
        ln -s .config/stow/gitconfig {h}/.gitconfig
    """, user="alice")  # fmt: skip
    yield testbed
    testbed.run(f"rm -rf {h}/told {h}/.config/stow {h}/.config/git; rm -f {h}/.gitconfig",
                check=False)
    testbed.write_file(f"{h}/.gitconfig", old_gitconfig)
    testbed.run(["chown", "alice:", f"{h}/.gitconfig"])
    testbed.write_file("/etc/leviath/config.toml", old)
    testbed.run(["systemctl", "restart", "leviathd"])


def _repos(bed: Testbed) -> str:
    base = f"{bed.users['alice'].home}/told"
    q = shlex.quote
    bed.run(f"""
        set -e
        cd {base}
        mkdir -p proj/.husky/_ proj/tools; cd proj
        git init -q -b main .
        printf %s {q(RUNNER)} > .husky/_/pre-commit; chmod +x .husky/_/pre-commit
        printf '#!/bin/sh\\necho legit-hook >> {base}/legit\\n' > .husky/pre-commit
        for s in pub up dt; do printf '#!/bin/sh\\necho legit-'$s' >> {base}/legit\\n' \\
          > tools/$s.sh; chmod +x tools/$s.sh; done
        echo one > file.txt
        git add -A; git commit -q -m one
        git worktree add -q -b a ../wta; git worktree add -q -b b ../wtb
        git config core.hooksPath .husky/_
        i=0; while [ $i -lt 1500 ]; do
          printf '\\tpad%s = log --oneline --decorate --graph -n %s\\n' $i $i; i=$((i+1))
        done > pad; {{ echo '[alias]'; cat pad; }} >> .git/config; rm pad
        git config alias.pub '!f() {{ ./tools/pub.sh; }}; f'
        git config remote.origin.url {base}/proj
        git config remote.origin.uploadpack './tools/up.sh; git-upload-pack'
        git config difftool.x.cmd './tools/dt.sh "$LOCAL" "$REMOTE"'
        cd {base}
        mkdir -p mono/frontend/.husky/_; cd mono
        git init -q -b main .
        printf %s {q(RUNNER)} > frontend/.husky/_/pre-commit
        chmod +x frontend/.husky/_/pre-commit
        printf '#!/bin/sh\\necho legit-mono >> {base}/legit\\n' > frontend/.husky/pre-commit
        git config core.hooksPath frontend/.husky/_
        echo one > frontend/file.txt; git add -A; git commit -q -m one
    """, user="alice")  # fmt: skip
    return base


def _t() -> str:
    return """
t() {
  name=$1; shift
  if out=$( ("$@") 2>&1 ); then echo "$name ok"
  else echo "$name refused"; echo "$name: $out" >&2; fi
}
"""


def _attacks_wta(base: str, home: str) -> str:
    pwn = f"#!/bin/sh\ntouch {base}/PWNED-$(basename $0)\n"
    q = shlex.quote
    evil = f"{base}/evilgit"
    fsmon = f"[core]\n\tfsmonitor = touch {base}/PWNED-commondir; false\n"
    return _t() + f"""
pwn={q(pwn)}
t husky-hook sh -c 'printf %s "$1" > .husky/pre-commit' _ "$pwn"
t alias-script sh -c 'printf %s "$1" > tools/pub.sh' _ "$pwn"
t uploadpack-script sh -c 'printf %s "$1" > tools/up.sh' _ "$pwn"
t difftool-script sh -c 'printf %s "$1" > tools/dt.sh' _ "$pwn"
t linked-global sh -c 'printf "[core]\\n\\tfsmonitor = touch {base}/PWNED-global; false\\n" \\
  >> {home}/.config/stow/gitconfig'
t global-alias-script sh -c 'printf %s "$1" > {home}/.config/stow/bin/dt.sh' _ "$pwn"
t xdg-global sh -c 'mkdir -p {home}/.config/git && printf "[core]\\n\\tpager = touch \\
  {base}/PWNED-xdg; cat\\n" >> {home}/.config/git/config'
t commondir sh -c 'git init -q {evil} && printf %s "$1" >> {evil}/config && \\
  printf "%s\\n" {evil} > {base}/proj/.git/worktrees/wtb/commondir' _ {q(fsmon)}
echo change >> file.txt && echo work ok
"""


def _attacks_mono(base: str) -> str:
    pwn = f"#!/bin/sh\ntouch {base}/PWNED-$(basename $0)\n"
    return _t() + f"""
pwn={shlex.quote(pwn)}
t mono-hook sh -c 'printf %s "$1" > .husky/pre-commit' _ "$pwn"
t mono-runner sh -c 'printf %s "$1" > .husky/_/pre-commit' _ "$pwn"
echo change >> file.txt && echo work ok
"""


def _results(out: str) -> dict[str, str]:
    return dict(line.rsplit(" ", 1) for line in out.splitlines()
                if line.endswith((" ok", " refused")))


def test_nothing_an_agent_writes_runs_at_alices_next_git_commands(bed: Testbed) -> None:
    base = _repos(bed)
    home = bed.users["alice"].home
    got: dict[str, str] = {}
    errors = ""
    for workdir, script in ((f"{base}/wta", _attacks_wta(base, home)),
                            (f"{base}/mono/frontend", _attacks_mono(base))):
        r = bed.run(["lev", "run", "--workdir", workdir, "--", "sh", "-c", script],
                    user="alice", check=False)
        results = _results(r.stdout)
        assert results.pop("work", None) == "ok", r.stdout + r.stderr
        got.update(results)
        errors += r.stderr
    assert len(got) == 10, got
    assert {k: v for k, v in got.items() if v != "refused"} == {}, errors
    # alice, on the host, her ordinary commands
    bed.run(f"""
        set -e
        cd {base}/wta
        echo a > hooked.txt; git add hooked.txt; git commit -q -m hooked
        git pub
        git dt
        git fetch -q origin
        echo more >> file.txt; git difftool -y -t x
        cd {base}/wtb && git status --short >/dev/null
        cd {base}/mono && git commit -q -am two
    """, user="alice")  # fmt: skip
    pwned = bed.run(f"ls {base} | grep PWNED", check=False).stdout
    assert pwned == "", pwned
    legit = bed.read_file(f"{base}/legit").split()
    for name in ("legit-hook", "legit-pub", "legit-dt", "legit-up", "legit-mono"):
        assert name in legit, legit
