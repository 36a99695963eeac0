"""Issue 15 §3, git over HTTP(S): an agent clones and pushes through the
sandbox's git credential helper, which asks the broker for the token of a
`kind = "git"` credential (a root-only file of the machine config). The
server is `git http-backend` behind a small Python HTTP server with basic
auth on the bed's loopback (plain http, so the credential says
allow_http). The agent cannot find the token in its environment, its files
or any /proc/*/environ or cmdline it can read; a push waits for a person."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator

import pytest
from journal_wait import journal_until
from loop_agent import LOOP
from loop_agent import LoopAgent as Agent
from testbed import Testbed

pytestmark = pytest.mark.testbed

PORT = 18452
TOKEN = "gittok-5ecret-81f2c0"
BLUEPRINT = """
[agent]
name = "gitcred"
description = "runs the test's git commands"
command = ["sh", "loop.sh"]
"""


SERVER = f"""
import base64, http.server, subprocess

GOOD = "Basic " + base64.b64encode(b"x-access-token:{TOKEN}").decode()

def log(line):
    with open("/root/git-http.log", "a") as f:
        f.write(line + "\\n")

class H(http.server.BaseHTTPRequestHandler):
    def serve(self):
        auth = self.headers.get("Authorization", "")
        state = "ok" if auth == GOOD else ("bad" if auth else "none")
        log(f"{{self.command}} {{self.path}} auth={{state}}")
        if state != "ok":
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="test"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path, _, query = self.path.partition("?")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        env = {{"GIT_PROJECT_ROOT": "/srv/git", "GIT_HTTP_EXPORT_ALL": "1",
               "REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query,
               "CONTENT_TYPE": self.headers.get("Content-Type", ""),
               "CONTENT_LENGTH": str(len(body)), "REMOTE_USER": "agent",
               "REMOTE_ADDR": "127.0.0.1", "PATH": "/usr/bin:/bin",
               "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
               "GIT_PROTOCOL": self.headers.get("Git-Protocol", "")}}
        out = subprocess.run(["git", "http-backend"], input=body, env=env,
                             capture_output=True).stdout
        sep = b"\\r\\n\\r\\n" if b"\\r\\n\\r\\n" in out else b"\\n\\n"
        head, _, rest = out.partition(sep)
        status, headers = 200, []
        for line in head.decode().splitlines():
            k, _, v = line.partition(":")
            if k.lower() == "status":
                status = int(v.split()[0])
            elif k:
                headers.append((k, v.strip()))
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)

    do_GET = do_POST = serve

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", {PORT}), H).serve_forever()
"""

CONFIG = f"""
[sandbox]
kind = "namespace"
# The host's network, chosen (the git server is on the bed's loopback; the
# default is the proxy since issue 30).
network = true

[taint]
approval_timeout = 20

[credentials.gitsrv]
kind = "git"
hosts = ["127.0.0.1:{PORT}"]
allow_http = true
access = ["fetch", "push"]
secret_file = "/etc/leviath/git.token"
"""

# Run inside the agent: everything the agent's user can read that might
# hold the token, while a clone runs (its git processes exist meanwhile).
SNOOP = f"""
git clone -q http://127.0.0.1:{PORT}/repo.git snoop &
clone=$!
hits=""
while kill -0 $clone 2>/dev/null; do
  for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
    grep -q -a {TOKEN} "$f" 2>/dev/null && hits="$hits $f"
  done
done
wait $clone; echo "clone=$?"
env | grep -c {TOKEN}
grep -r -l -a {TOKEN} "$HOME" . /tmp 2>/dev/null | head
cat /etc/leviath/git.token 2>&1 | head -c 200; echo
echo "hits:$hits"
echo "helper:$(git config --get-urlmatch credential.helper http://127.0.0.1:{PORT}/)"
"""


def lev(bed: Testbed, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return bed.run(["lev", *args], user="alice", check=check)


def pending(bed: Testbed, agent_id: str, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for row in json.loads(lev(bed, "approvals", "--json").stdout):
            if row["agent"] == agent_id:
                return dict(row)
        time.sleep(0.2)
    raise AssertionError(f"no approval request of agent {agent_id} appeared")


def server_log(bed: Testbed) -> list[str]:
    return bed.run(["cat", "/root/git-http.log"], check=False).stdout.splitlines()


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    old = bed.run(["cat", "/etc/leviath/config.toml"], check=False)
    h = bed.users["alice"].home
    bed.run(f"mkdir -p {h}/gitw/.req {h}/gitbp && cat > {h}/gitbp/blueprint.toml",
            user="alice", input=BLUEPRINT)
    bed.run(["sh", "-c", "cat > loop.sh"], user="alice", cwd=f"{h}/gitw", input=LOOP)
    bed.run("""
        set -e
        rm -rf /srv/git /root/seed /root/git-http.log
        mkdir -p /srv/git
        git init -q --bare -b main /srv/git/repo.git
        git init -q -b main /root/seed
        cd /root/seed
        echo hello > README
        git add README
        git -c user.name=t -c user.email=t@t commit -q -m first
        git push -q /srv/git/repo.git main
    """)
    bed.write_file("/etc/leviath/git.token", TOKEN + "\n", mode=0o600)
    bed.write_file("/etc/leviath/config.toml", CONFIG)
    bed.write_file("/root/githttp.py", SERVER)
    server = subprocess.Popen(bed.command(["python3", "/root/githttp.py"]))
    bed.run(["systemctl", "restart", "leviathd"])
    yield bed
    server.kill()
    server.wait()
    if old.returncode == 0:
        bed.write_file("/etc/leviath/config.toml", old.stdout)
    else:
        bed.run(["rm", "-f", "/etc/leviath/config.toml"])
    bed.run(["rm", "-rf", "/etc/leviath/git.token", "/srv/git", "/root/seed",
             "/root/git-http.log", "/root/githttp.py"])
    bed.run(["systemctl", "restart", "leviathd"])


@pytest.fixture(scope="module")
def agent(bed: Testbed) -> Iterator[Agent]:
    h = bed.users["alice"].home
    out = bed.run(["lev", "run", "--detach", f"{h}/gitbp"], user="alice",
                  cwd=f"{h}/gitw").stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", out), out
    yield Agent(bed, out, f"{h}/gitw")
    lev(bed, "stop", out, check=False)


def test_the_agent_clones_with_a_token_it_cannot_find(bed: Testbed, agent: Agent) -> None:
    rc, out, err = agent.call(f"git clone -q http://127.0.0.1:{PORT}/repo.git r && cat r/README")
    assert rc == 0, err
    assert "hello" in out
    assert any("auth=ok" in line for line in server_log(bed))
    rc, out, err = agent.call(SNOOP)
    assert "clone=0" in out, (out, err)
    lines = out.splitlines()
    assert lines[1] == "0", out  # not in the agent's environment
    assert TOKEN not in out and TOKEN not in err, out  # nor in its files, /proc or /etc
    assert "Permission denied" in out  # the secret file itself is root's
    assert "hits:\n" in out + "\n", out
    assert "/run/leviath/bin/git-credential-leviath" in out
    # The clone keeps no credential (the helper list is ours alone: no store).
    assert TOKEN not in bed.run(["sh", "-c", f"cat {agent.workdir}/r/.git/config; "
                                 f"ls -a {bed.users['alice'].home}"]).stdout
    journal = journal_until(bed, ["-o", "json", f"LEVIATH_AGENT={agent.id}"],
                            lambda out: '"LEVIATH_TOOL":"git_fetch"' in out.replace(" ", ""))
    assert '"LEVIATH_TOOL":"git_fetch"' in journal.replace(" ", "")
    assert TOKEN not in journal


def test_a_host_no_credential_covers_gets_no_token(bed: Testbed, agent: Agent) -> None:
    before = len(server_log(bed))
    rc, _, _ = agent.call(
        f"GIT_TERMINAL_PROMPT=0 git clone -q http://localhost:{PORT}/repo.git u")
    assert rc != 0
    seen = server_log(bed)[before:]
    assert seen and not any("auth=ok" in line for line in seen), seen
    # git asks no helper of ours for that URL; asked directly, the broker says no.
    rc, out, err = agent.call(f"printf 'protocol=http\\nhost=localhost:{PORT}\\n"
                              "path=repo.git\\n\\n' | /run/leviath/bin/git-credential-leviath get")
    assert rc == 0 and "password" not in out, out
    assert "no git credential covers" in err, err


def test_a_push_waits_for_a_person_and_runs_once_approved(bed: Testbed, agent: Agent) -> None:
    n = agent.submit("cd r && echo more >> README && git -c user.name=a -c user.email=a@a "
                     "commit -q -am second && git push -q origin main")
    row = pending(bed, agent.id)
    assert row["tool"] == "git_push"
    assert f"127.0.0.1:{PORT}/repo.git" in row["target"]
    time.sleep(1)
    assert "second" not in bed.run(["git", "--git-dir", "/srv/git/repo.git", "log",
                                    "--oneline"]).stdout  # held: nothing pushed yet
    lev(bed, "approve", row["id"], "--once")
    rc, _, err = agent.result(n)
    assert rc == 0, err
    assert "second" in bed.run(["git", "--git-dir", "/srv/git/repo.git", "log",
                                "--oneline"]).stdout


def test_a_denied_push_gets_no_token_and_pushes_nothing(bed: Testbed, agent: Agent) -> None:
    n = agent.submit("cd r && echo third >> README && git -c user.name=a -c user.email=a@a "
                     "commit -q -am third && GIT_TERMINAL_PROMPT=0 git push -q origin main")
    row = pending(bed, agent.id)
    lev(bed, "approve", row["id"], "--deny")
    rc, _, err = agent.result(n)
    assert rc != 0
    assert "git_push" in err  # the helper says why git had no token
    assert "third" not in bed.run(["git", "--git-dir", "/srv/git/repo.git", "log",
                                   "--oneline"]).stdout


def test_an_unsandboxed_agent_gets_the_helper_by_the_host_path(bed: Testbed) -> None:
    home = bed.users["dave"].home
    bed.run(f"rm -rf {home}/gitnone && mkdir -p {home}/gitnone", user="dave")
    r = bed.run(["lev", "run", "--no-sandbox", "--", "sh", "-c",
                 "git config --get-urlmatch credential.helper "
                 f"http://127.0.0.1:{PORT}/ && git clone -q http://127.0.0.1:{PORT}/repo.git r "
                 "&& cat r/README"], user="dave", cwd=f"{home}/gitnone")
    lines = r.stdout.splitlines()
    assert re.fullmatch(r"!/bin/sh /run/leviath/agents/[0-9a-f]{8}/bin/git-credential-leviath",
                        lines[0]), lines
    assert "hello" in lines[1:], lines
