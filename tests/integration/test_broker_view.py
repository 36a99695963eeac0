"""Issue 43 items 3 and 4 from the attacker's side, in the test bed.

Item 3: the broker's file tools act in the agent's view. Alice's agent, in a
namespace fence, calls `lev tool write_file` / `edit_file` on every file its
fence shows read-only (the workdir's `.git/config` and hooks, husky's hooks
that `core.hooksPath` names, the workdir's `.claude/settings.json`), under a
read-only workdir, and under a throwaway one: each is refused (or, under
throwaway, lands in the agent's layer), and the host's files are as they
were. Before, the broker opened files as alice in the host's view and wrote
them all: alice's next `git commit` on the host ran the agent's hook.

Item 4: answers come from outside the agents. dave's agent (unsandboxed, so
its processes reach the system bus as dave, as a container engine's RUN step
did in the issue's attack) holds a tool call, lists it with `lev approvals`,
and tries to approve it, to stop an agent, to edit the machine's policy and
to start an agent: each is refused by name; dave outside it still answers.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator

import pytest
from testbed import Testbed

CONFIG = """
[sandbox]
kind = "namespace"

[tool_permissions]
read_file = "allow"
write_file = "allow"
edit_file = "allow"
list_dir = "ask"
"""

HOOK = "#!/bin/sh\necho legit\n"
SETTINGS = '{"theme": "dark"}\n'
EVIL = "#!/bin/sh\ntouch /tmp/PWNED\n"


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    testbed.run(["systemctl", "restart", "leviathd"])
    yield testbed
    for user, folder in (("alice", "bview"), ("dave", "ans")):
        testbed.run(["rm", "-rf", f"{testbed.users[user].home}/{folder}"], check=False)


def _repo(bed: Testbed, name: str) -> str:
    """Alice's husky repository (`core.hooksPath = .husky/_`), with a hook
    in .git/hooks, the workdir's agent settings and a plain file."""
    home = bed.users["alice"].home
    proj = f"{home}/bview/{name}"
    bed.run(f"""
        set -e
        rm -rf {proj}; mkdir -p {proj}/.husky/_ {proj}/.claude {home}/.claude {home}/.ssh
        cd {proj}
        git init -q -b main .
        git config user.name A; git config user.email a@example.org
        git config core.hooksPath .husky/_
        printf '%s' {shlex.quote(HOOK)} > .git/hooks/pre-commit
        printf '%s' {shlex.quote(HOOK)} > .husky/_/pre-commit
        chmod +x .git/hooks/pre-commit .husky/_/pre-commit
        printf '%s' {shlex.quote(SETTINGS)} > .claude/settings.json
        echo one > file.txt
        git add file.txt; git commit -q -m one
        [ -f {home}/.ssh/id_rsa ] || echo SECRET-KEY > {home}/.ssh/id_rsa
        chmod 700 {home}/.ssh; chmod 600 {home}/.ssh/id_rsa
    """, user="alice")  # fmt: skip
    return proj


def _tool(name: str, label: str, **args: str) -> str:
    """A probe line: `label RC MESSAGE` for one `lev tool` call."""
    return (f"out=$(lev tool {name} --json {shlex.quote(json.dumps(args))} 2>&1); rc=$?; "
            f"printf '%s %s %s\\n' {label} $rc \"$(printf %s \"$out\" | tr '\\n' ' ' "
            "| head -c 300)\"\n")


def _probe(bed: Testbed, proj: str, script: str, *run_args: str) -> dict[str, tuple[int, str]]:
    """Run `script` in alice's agent (attached, in `proj`); each probe's
    (exit status, message) by label."""
    bed.run(["sh", "-c", 'cat > "$1"', "probe", f"{proj}/.probe.sh"], user="alice",
            input=script)
    r = bed.run(["lev", "run", *run_args, "--", "sh", ".probe.sh"], user="alice", cwd=proj,
                timeout=120)
    out: dict[str, tuple[int, str]] = {}
    for line in r.stdout.splitlines():
        label, _, rest = line.partition(" ")
        rc, _, message = rest.partition(" ")
        if rc.isdigit():
            out[label] = (int(rc), message)
    return out


def _refused(probes: dict[str, tuple[int, str]], label: str) -> None:
    assert label in probes, probes
    rc, message = probes[label]
    assert rc != 0, f"{label}: the broker wrote it: {message}"


def _ok(probes: dict[str, tuple[int, str]], label: str) -> str:
    assert label in probes, probes
    rc, message = probes[label]
    assert rc == 0, f"{label}: {message}"
    return message


PROTECTED = {
    ".git/config": None,
    ".git/hooks/pre-commit": HOOK,
    ".husky/_/pre-commit": HOOK,
    ".claude/settings.json": SETTINGS,
}


def test_file_tools_cannot_write_what_the_fence_keeps_read_only(bed: Testbed) -> None:
    proj = _repo(bed, "rw")
    before = {p: bed.read_file(f"{proj}/{p}") for p in PROTECTED}
    home = bed.users["alice"].home
    script = "".join([
        *(_tool("write_file", f"w:{p}", path=p, content=EVIL) for p in PROTECTED),
        _tool("edit_file", "e:.git/config", path=".git/config", old="[core]",
              new="[core]\n\tfsmonitor = touch /tmp/PWNED; false\n"),
        _tool("edit_file", "e:.git/hooks/pre-commit", path=".git/hooks/pre-commit",
              old="legit", new="pwned"),
        _tool("edit_file", "e:.husky/_/pre-commit", path=".husky/_/pre-commit",
              old="legit", new="pwned"),
        _tool("read_file", "r:ssh", path=f"{home}/.ssh/id_rsa"),
        _tool("write_file", "w:ok", path="ok.txt", content="fine\n"),
        _tool("read_file", "r:ok", path="ok.txt"),
    ])
    probes = _probe(bed, proj, script)
    for p in PROTECTED:
        _refused(probes, f"w:{p}")
    for label in ("e:.git/config", "e:.git/hooks/pre-commit", "e:.husky/_/pre-commit",
                  "r:ssh"):
        _refused(probes, label)
    assert "SECRET-KEY" not in probes["r:ssh"][1]
    # The tools still work where the agent may write: in its view, the host's file.
    _ok(probes, "w:ok")
    assert "fine" in _ok(probes, "r:ok")
    assert bed.read_file(f"{proj}/ok.txt") == "fine\n"
    after = {p: bed.read_file(f"{proj}/{p}") for p in PROTECTED}
    assert after == before
    # Alice's commit on the host runs her own hook, nothing of the agent's.
    r = bed.run("git add ok.txt && git commit -q -m two", user="alice", cwd=proj)
    assert "legit" in r.stdout + r.stderr
    assert bed.run(["test", "-e", "/tmp/PWNED"], check=False).returncode != 0


def test_file_tools_never_write_a_read_only_workdir(bed: Testbed) -> None:
    proj = _repo(bed, "ro")
    script = "".join([
        _tool("write_file", "w:new", path="new.txt", content="agent\n"),
        _tool("write_file", "w:file", path="file.txt", content="agent\n"),
        _tool("edit_file", "e:file", path="file.txt", old="one", new="agent"),
        _tool("write_file", "w:hook", path=".git/hooks/pre-commit", content=EVIL),
        _tool("read_file", "r:file", path="file.txt"),
    ])
    probes = _probe(bed, proj, script, "--workdir-mode", "ro")
    for label in ("w:new", "w:file", "e:file", "w:hook"):
        _refused(probes, label)
    assert "one" in _ok(probes, "r:file")
    assert bed.run(["test", "-e", f"{proj}/new.txt"], check=False).returncode != 0
    assert bed.read_file(f"{proj}/file.txt") == "one\n"
    assert bed.read_file(f"{proj}/.git/hooks/pre-commit") == HOOK


def test_file_tools_write_a_throwaway_workdirs_layer_never_the_host(bed: Testbed) -> None:
    proj = _repo(bed, "throwaway")
    script = "".join([
        _tool("write_file", "w:new", path="new.txt", content="layer\n"),
        _tool("read_file", "r:new", path="new.txt"),
        _tool("edit_file", "e:file", path="file.txt", old="one", new="agent"),
        _tool("read_file", "r:file", path="file.txt"),
        "printf 'shell %s %s\\n' 0 \"$(cat new.txt file.txt | tr '\\n' ' ')\"\n",
        _tool("write_file", "w:hook", path=".git/hooks/pre-commit", content=EVIL),
    ])
    probes = _probe(bed, proj, script, "--workdir-mode", "throwaway")
    # The agent's own view: what the tools wrote is what its processes read.
    assert "layer" in _ok(probes, "r:new")
    _ok(probes, "e:file")
    # Read with the open that resolved it (issue 47): the layer's, not the host's.
    assert "agent" in _ok(probes, "r:file"), probes["r:file"]
    assert probes["shell"][1].split() == ["layer", "agent"], probes["shell"]
    # The host's tree is as it was.
    assert bed.run(["test", "-e", f"{proj}/new.txt"], check=False).returncode != 0
    assert bed.read_file(f"{proj}/file.txt") == "one\n"
    assert bed.read_file(f"{proj}/.git/hooks/pre-commit") == HOOK


INSIDE = """
r=$HOME/ans
lev tool list_dir . > $r/held.out 2> $r/held.err &
n=0
until lev approvals --json > $r/rows.json 2>/dev/null && grep -q '"list_dir"' $r/rows.json; do
  n=$((n+1)); [ $n -gt 600 ] && break; sleep 0.1
done
pick() { python3 -c 'import json, sys
print([r[sys.argv[2]] for r in json.load(open(sys.argv[1])) if r["tool"] == "list_dir"][0])' \
  $r/rows.json "$1"; }
id=$(pick id); agent=$(pick agent)
try() { name=$1; shift; "$@" > $r/$name.out 2>&1; echo $? > $r/$name.rc; }
try approve lev approve "$id" --once
try deny lev approve "$id" --deny
try policy lev policy add --system http_post --target example.org --max-sensitivity public
try run lev run --detach -- true
echo "$id" > $r/id.tmp; mv $r/id.tmp $r/id
try stop lev stop "$agent"
wait
echo done > $r/end
"""


def _wait_file(bed: Testbed, path: str) -> None:
    bed.run(["sh", "-c", f"until [ -f {path} ]; do sleep 0.05; done"], timeout=90)


def test_a_held_call_is_never_answered_from_inside_an_agent(bed: Testbed) -> None:
    home = bed.users["dave"].home
    r = f"{home}/ans"
    bed.run(["sh", "-c", f"rm -rf {r}; mkdir -p {r}"], user="dave")
    bed.write_file(f"{r}.sh", INSIDE)
    bed.run(["chown", "dave", f"{r}.sh"])
    agent = bed.run(["lev", "run", "--detach", "--no-sandbox", "--", "sh", f"{r}.sh"],
                    user="dave", cwd=r).stdout.strip()
    try:
        _wait_file(bed, f"{r}/id")
        request = bed.read_file(f"{r}/id").strip()
        for name in ("approve", "deny", "policy", "run", "stop"):
            # (stop's is written last: before, it ended this very agent)
            _wait_file(bed, f"{r}/{name}.rc")
            rc = int(bed.read_file(f"{r}/{name}.rc"))
            said = bed.read_file(f"{r}/{name}.out")
            assert rc != 0 and "from inside an agent" in said, (name, rc, said)
        # Still held: dave, outside every agent, answers it.
        rows = json.loads(bed.run(["lev", "approvals", "--json"], user="dave").stdout)
        assert request in [row["id"] for row in rows]
        bed.run(["lev", "approve", request, "--once"], user="dave")
        _wait_file(bed, f"{r}/end")
        assert '"entries"' in bed.read_file(f"{r}/held.out"), bed.read_file(f"{r}/held.err")
    finally:
        bed.run(["lev", "stop", agent], user="dave", check=False)
        bed.run(["rm", "-f", f"{r}.sh"], check=False)
