"""Issue 15 §3, wrapped CLIs: with a `kind = "cli"` credential, `gh` first on
the sandbox's PATH is the daemon's wrapper, which has the broker run the real
`gh` in the credential fence with GH_TOKEN set for that call only.

There is no GitHub here: the real `gh` is a stand-in, FAKE_GH below
(/usr/local/bin/gh in the bed), which prints its arguments and whether a
token came (a hash of it, never the token), and can stay a while so the
attacker can look at it. The attacker is the agent (its /proc) and alice on
the host, the same uid as the process holding the token (/proc environ, mem,
ptrace)."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator

import pytest
from loop_agent import LOOP
from loop_agent import LoopAgent as Agent
from testbed import Testbed

pytestmark = pytest.mark.testbed

TOKEN = "ghp_stand1n_t0ken_7731"
HASH = hashlib.sha256(TOKEN.encode()).hexdigest()[:16]
FAKE_GH = """#!/bin/sh
# A stand-in for GitHub's gh: says whether it got a token, never what it is.
echo "args: $*"
if [ -n "$GH_TOKEN" ]; then
  echo "token: yes $(printf %s "$GH_TOKEN" | sha256sum | cut -c1-16)"
else
  echo "token: no"
fi
echo "stdin: $(cat | wc -c)"
case "$1" in
  slow) echo $$ > gh.pid.tmp; mv gh.pid.tmp gh.pid; sleep 8 ;;
  fail) echo "gh: something failed" >&2; exit 3 ;;
esac
exit 0
"""
BLUEPRINT = """
[agent]
name = "ghcred"
description = "runs the test's gh commands"
command = ["sh", "loop.sh"]
"""
CONFIG = """
[sandbox]
kind = "namespace"

[credentials.gh]
kind = "cli"
command = ["gh"]
token_env = "GH_TOKEN"
secret_file = "/etc/leviath/gh.token"
"""
PEEK = r"""
import ctypes, sys
pid, secret = sys.argv[1], sys.argv[2].encode()
found, errors = [], []
def attempt(what, fn):
    try:
        data = fn()
    except OSError as e:
        errors.append(f"{what}: {e.strerror}")
        return
    if secret in data:
        found.append(what)
def mem():
    out = b""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as m:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            try:
                m.seek(lo); out += m.read(min(hi - lo, 1 << 24))
            except OSError:
                pass
    return out
attempt("environ", lambda: open(f"/proc/{pid}/environ", "rb").read())
attempt("mem", mem)
libc = ctypes.CDLL(None, use_errno=True)
if libc.ptrace(16, int(pid), 0, 0) == 0:  # PTRACE_ATTACH
    found.append("ptrace")
else:
    errors.append(f"ptrace: errno {ctypes.get_errno()}")
print("FOUND", found)
print("ERRORS", errors)
"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    old = bed.run(["cat", "/etc/leviath/config.toml"], check=False)
    h = bed.users["alice"].home
    bed.run(f"mkdir -p {h}/ghw/.req {h}/ghbp && cat > {h}/ghbp/blueprint.toml",
            user="alice", input=BLUEPRINT)
    bed.run(["sh", "-c", "cat > loop.sh"], user="alice", cwd=f"{h}/ghw", input=LOOP)
    bed.write_file("/usr/local/bin/gh", FAKE_GH, mode=0o755)
    bed.write_file("/etc/leviath/gh.token", TOKEN + "\n", mode=0o600)
    bed.write_file("/etc/leviath/config.toml", CONFIG)
    bed.write_file("/tmp/peek-gh.py", PEEK)
    bed.run(["systemctl", "restart", "leviathd"])
    yield bed
    if old.returncode == 0:
        bed.write_file("/etc/leviath/config.toml", old.stdout)
    else:
        bed.run(["rm", "-f", "/etc/leviath/config.toml"])
    bed.run(["rm", "-f", "/etc/leviath/gh.token", "/usr/local/bin/gh", "/tmp/peek-gh.py"])
    bed.run(["systemctl", "restart", "leviathd"])


@pytest.fixture(scope="module")
def agent(bed: Testbed) -> Iterator[Agent]:
    h = bed.users["alice"].home
    out = bed.run(["lev", "run", "--detach", f"{h}/ghbp"], user="alice",
                  cwd=f"{h}/ghw").stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", out), out
    yield Agent(bed, out, f"{h}/ghw")
    bed.run(["lev", "stop", out], user="alice", check=False)


def test_gh_in_the_sandbox_is_the_wrapper_and_the_real_one_gets_the_token(agent: Agent) -> None:
    rc, out, err = agent.call("command -v gh; gh pr list --limit 3")
    assert rc == 0, err
    assert out.splitlines()[0] == "/run/leviath/bin/gh"
    assert "args: pr list --limit 3" in out
    assert f"token: yes {HASH}" in out  # the stand-in got the token...
    assert "stdin: 0" in out  # ...and nothing left of it on its stdin
    assert TOKEN not in out + err


def test_the_real_clis_status_and_errors_come_back(agent: Agent) -> None:
    rc, _, err = agent.call("gh fail")
    assert rc == 3
    assert "gh: something failed" in err


def test_the_token_stays_out_of_reach_while_the_real_cli_runs(bed: Testbed, agent: Agent) -> None:
    # The agent looks at every /proc file it can read for as long as gh runs.
    n = agent.submit("gh slow > slow.out 2>&1 & w=$!; hits=0; "
                     "while kill -0 $w 2>/dev/null; do "
                     f"grep -q -a {TOKEN} /proc/[0-9]*/environ /proc/[0-9]*/cmdline "
                     "2>/dev/null && hits=1; done; "
                     f"echo hits=$hits env=$(env | grep -c {TOKEN})")
    deadline = time.monotonic() + 20
    pid = ""
    while not pid:
        assert time.monotonic() < deadline, "the stand-in never started"
        time.sleep(0.1)
        pid = bed.run(["sh", "-c", "for p in $(pgrep -u alice -x sleep); do "
                       "pp=$(ps -o ppid= -p $p | tr -d ' '); "
                       "[ -e /proc/$pp/cwd/gh.pid ] && echo $pp; done"],
                      check=False).stdout.strip().split("\n")[0]
    assert bed.run(["stat", "-c", "%u", f"/proc/{pid}"]).stdout.strip() == str(
        bed.users["alice"].uid)  # alice's own process...
    assert TOKEN in bed.run(["sh", "-c", f"tr '\\0' '\\n' < /proc/{pid}/environ"]).stdout
    peek = bed.run(["python3", "/tmp/peek-gh.py", pid, TOKEN], user="alice").stdout
    assert "FOUND []" in peek, peek  # ...which alice cannot look into
    assert "environ: Permission denied" in peek and "ptrace: errno 1" in peek, peek
    _, out, err = agent.result(n)
    assert out.strip() == "hits=0 env=0", (out, err)  # nothing the agent can read holds it
    assert f"token: yes {HASH}" in bed.read_file(f"{agent.workdir}/slow.out")
