"""Issue 45 item 1, Gemini CLI's own token refresh inside an agent answered
by the daemon, with the real Gemini CLI 0.61.0 (the vendor's npm package,
pinned in scripts/setup, run from /opt/leviath-dev/npm/prefix).

alice is logged in to Gemini CLI with Google on the host
(~/.gemini/oauth_creds.json, settings.json choosing that login); her
access token expires in a minute, so the CLI refreshes before its first
request (google-auth-library refreshes within five minutes of
`expiry_date`).

The STAND-IN for Google's servers is a TLS server of the test's in a network
namespace (test_cli_logins.stand_in). As oauth2.googleapis.com it answers
/token with a new access and ID token and /tokeninfo; as
cloudcode-pa.googleapis.com it answers the Code Assist calls with a reply of
its own. It logs each request's Host, path, Authorization and the refresh
token of a form body.

- `gemini -p` inside gets the stand-in's reply; the stand-in's token endpoint
  got alice's REAL refresh token once, from the daemon, in a form body with
  the CLI's client; alice's host file holds the new access and ID tokens and
  expiry (her refresh token, other keys, mode and owner kept); the agent's
  oauth_creds.json holds placeholders only; the CLI's Code Assist requests
  after the refresh reached the stand-in with the NEW access token;
- the attacker's side: a form with a forged refresh token, and one naming
  refresh_token twice, are refused (403); nothing reaches the token endpoint
  and the host's file is not written.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.parse
from collections.abc import Iterator

import pytest
from loop_agent import lay_out
from test_cli_logins import SERVE_TAIL, stand_in, stand_in_log
from test_egress_credentials import answering
from test_gate_bed import Agent
from testbed import Testbed

pytestmark = pytest.mark.testbed

GEMINI = "/opt/leviath-dev/npm/prefix/bin/gemini"
HOSTS = ("oauth2.googleapis.com", "cloudcode-pa.googleapis.com", "www.googleapis.com",
         "play.googleapis.com", "other.test")
CLIENT_ID = "681255809395-oo8ft2oprdrnp9e3aqf6av3hmdib135j.apps.googleusercontent.com"


def _b64(doc: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()


def jwt(sig: str, **claims: object) -> str:
    return f"{_b64({'alg': 'RS256', 'typ': 'JWT'})}.{_b64(claims)}.{sig}"


NOW = int(time.time())
ACCESS = "ya29.RealGoogle0Access0Of0Alice0Ab3Cd5Ef7Gh9Ij2Kl4Mn6Op8Qr1St"
REFRESH = "1//RealGoogle0Refresh0Of0Alice0Uv3Wx5Yz7Ab9Cd2Ef4Gh6Ij8Kl1"
ID = jwt("RealIdSignature0Of0Alice0Zu8Pe1Ox4Mi7Ky2Gl5Db9Sa3Fj6", email="alice@example.com",
         exp=NOW + 60, aud=CLIENT_ID)
NEW_ACCESS = "ya29.NewGoogle0Access0From0The0Standin0Hq4Wz8Ly1Nc5Vr3Ke"
NEW_ID = jwt("NewIdSignature0From0The0Standin0Ub6Jt2Xo9Sm4Dg7Kc1", email="alice@example.com",
             exp=NOW + 3600, aud=CLIENT_ID)
REAL = (ACCESS, REFRESH, ID, NEW_ACCESS, NEW_ID)
SCOPE = ("https://www.googleapis.com/auth/cloud-platform "
         "https://www.googleapis.com/auth/userinfo.email openid")
LOGIN = {"access_token": ACCESS, "refresh_token": REFRESH, "scope": SCOPE,
         "token_type": "Bearer", "id_token": ID, "expiry_date": (NOW + 60) * 1000}
SETTINGS = {"security": {"auth": {"selectedType": "oauth-personal"}}}

BLUEPRINT = """
[agent]
name = "geminirefresh"
description = "runs the test's commands"
command = ["sh", "loop.sh"]
"""

SERVER = f"""
import http.server, json, ssl, urllib.parse

TOKENS = json.dumps({{"access_token": "{NEW_ACCESS}", "id_token": "{NEW_ID}",
                     "expires_in": 3599, "scope": "{SCOPE}", "token_type": "Bearer"}}).encode()
INFO = json.dumps({{"aud": "{CLIENT_ID}", "expires_in": 3000, "scope": "{SCOPE}",
                   "email": "alice@example.com"}}).encode()
REPLY = {{"candidates": [{{"content": {{"role": "model", "parts": [{{"text": "standin-pong"}}]}},
                          "finishReason": "STOP", "index": 0}}],
         "usageMetadata": {{"promptTokenCount": 1, "candidatesTokenCount": 1,
                           "totalTokenCount": 2}}}}
LOAD = json.dumps({{"currentTier": {{"id": "free-tier", "name": "standin"}},
                   "allowedTiers": [{{"id": "free-tier", "name": "standin", "isDefault": True}}],
                   "cloudaicompanionProject": "standin-project"}}).encode()

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def serve(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        try:
            form = dict(urllib.parse.parse_qsl(body.decode()))
        except Exception:
            form = {{}}
        path = self.path.split("?")[0]
        with open("/srv/cli45/log.jsonl", "a") as f:
            f.write(json.dumps({{"host": self.headers.get("Host", ""), "path": path,
                                "method": self.command,
                                "auth": self.headers.get("Authorization", ""),
                                "refresh": form.get("refresh_token", ""),
                                "client": form.get("client_id", ""),
                                "secret": form.get("client_secret", "")}}) + "\\n")
        kind, out = "application/json", b"{{}}"
        if path == "/token":
            out = TOKENS
        elif path == "/tokeninfo":
            out = INFO
        elif path == "/oauth2/v2/userinfo":
            out = json.dumps({{"id": "1", "email": "alice@example.com"}}).encode()
        elif path.endswith(":loadCodeAssist"):
            out = LOAD
        elif path.endswith(":streamGenerateContent"):
            kind = "text/event-stream"
            out = ("data: " + json.dumps({{"response": REPLY, "traceId": "t1"}})
                   + "\\n\\n").encode()
        elif path.endswith(":generateContent"):
            out = json.dumps({{"response": REPLY, "traceId": "t1"}}).encode()
        elif path.endswith(":countTokens"):
            out = b'{{"totalTokens": 1}}'
        code = 200
{SERVE_TAIL}"""


@pytest.fixture(scope="module")
def agent(testbed: Testbed) -> Iterator[Agent]:
    bed = testbed
    if bed.run(["test", "-x", GEMINI], check=False).returncode != 0:
        pytest.fail(f"{GEMINI} is missing: run scripts/setup (it fetches the pinned npm packages)")
    home = bed.users["alice"].home
    files = {".gemini/oauth_creds.json": LOGIN, ".gemini/settings.json": SETTINGS}
    login = f"{home}/.gemini/oauth_creds.json"
    assert bed.run(["test", "-e", login], check=False).returncode != 0
    # settings.json may be there already: the fence makes the CLIs' protected
    # settings files (empty) when another module's agent started.
    old = bed.run(["cat", f"{home}/.gemini/settings.json"], check=False)
    for rel, doc in files.items():
        bed.run(["sh", "-c", 'mkdir -p -m 700 "$(dirname "$1")" && umask 077 && cat > "$1"',
                 "login", rel], user="alice", cwd=home, input=json.dumps(doc, indent=2))
    lay_out(bed, "gmw", "gmbp", BLUEPRINT)
    try:
        with stand_in(bed, SERVER, HOSTS):
            out = bed.run(["lev", "run", "--detach", f"{home}/gmbp"], user="alice",
                          cwd=f"{home}/gmw").stdout.strip()
            assert len(out) == 8, out
            with answering(bed, Agent(bed, "alice", out, f"{home}/gmw")) as a:
                yield a
    finally:
        bed.run(["rm", "-f", login], check=False)
        if old.returncode == 0:
            bed.run(["sh", "-c", 'cat > "$1"', "restore", ".gemini/settings.json"],
                    user="alice", cwd=home, input=old.stdout, check=False)
        else:
            bed.run(["rm", "-f", f"{home}/.gemini/settings.json"], check=False)


def _split(secret: str) -> str:
    return f"'{secret[:20]}''{secret[20:]}'"


def _form(token: str, extra: str = "") -> str:
    """Gemini CLI 0.61.0's refresh form (google-auth-library 10.9.0)."""
    return urllib.parse.urlencode({"refresh_token": token, "client_id": CLIENT_ID,
                                   "client_secret": "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",
                                   "grant_type": "refresh_token"}) + extra


def test_gemini_clis_refresh_inside_is_answered_by_the_daemon_and_updates_the_hosts_file(
        testbed: Testbed, agent: Agent) -> None:
    home = testbed.users["alice"].home
    host_file = f"{home}/.gemini/oauth_creds.json"
    before = testbed.read_file(host_file)
    mode = testbed.run(["stat", "-c", "%a %U", host_file]).stdout.strip()
    forged = "1//Forged0Token0Of0The0Agent0Kq2Wm7Xb4Zn8Lp3Vd6Rt"
    rc, out, err = agent.call(f"""
rph=$(python3 -c 'import json,os; print(json.load(open(os.path.expanduser(
    "~/.gemini/oauth_creds.json")))["refresh_token"])')
echo $rph
curl -sS -o /dev/null -w '%{{http_code}}\\n' https://oauth2.googleapis.com/token \\
  --data-binary {_form(forged)!r}
curl -sS -o /dev/null -w '%{{http_code}}\\n' https://oauth2.googleapis.com/token \\
  --data-binary "{_form(forged)}&refresh_token=$rph"
""", timeout=60)
    assert rc == 0, (out, err)
    refresh_ph, forged_status, twice_status = out.splitlines()
    assert refresh_ph.startswith("1//") and refresh_ph != REFRESH
    assert (forged_status, twice_status) == ("403", "403"), out
    assert not [e for e in stand_in_log(testbed) if e["path"] == "/token"]
    assert testbed.read_file(host_file) == before

    # --skip-trust: a headless run in an untrusted folder exits (55) otherwise;
    # -m: no model routing call, whose answer the stand-in does not imitate.
    rc, out, err = agent.call(f"""
timeout 150 {GEMINI} --skip-trust -m gemini-2.5-flash -p 'say hello' \
  > gemini.out 2> gemini.err
echo "gemini=$?"
python3 -c 'import json,os; print(json.dumps(json.load(open(os.path.expanduser(
    "~/.gemini/oauth_creds.json")))))'
grep -r -l -a {" ".join(f"-e {_split(s)}" for s in REAL)} "$HOME" /tmp . 2>/dev/null | head
""", timeout=200)
    assert rc == 0, (out, err)
    lines = out.splitlines()
    reply = testbed.read_file(f"{agent.workdir}/gemini.out")
    errors = testbed.read_file(f"{agent.workdir}/gemini.err")
    log = stand_in_log(testbed)
    assert lines[0] == "gemini=0" and "standin-pong" in reply, (out, reply, errors, log)
    to_token = [e for e in log if e["path"] == "/token"]
    assert [(e["refresh"], e["client"]) for e in to_token] == [(REFRESH, CLIENT_ID)], to_token
    host = json.loads(testbed.read_file(host_file))
    assert (host["access_token"], host["id_token"], host["refresh_token"]) == (
        NEW_ACCESS, NEW_ID, REFRESH), host
    assert host["expiry_date"] > LOGIN["expiry_date"] and host["token_type"] == "Bearer"
    assert testbed.run(["stat", "-c", "%a %U", host_file]).stdout.strip() == mode == "600 alice"
    seen = json.loads(lines[1])
    assert seen["access_token"].startswith("ya29.") and seen["refresh_token"] == refresh_ph
    assert seen["expiry_date"] == host["expiry_date"]
    assert lines[2:] == [], out
    to_api = [e for e in log if e["host"] == "cloudcode-pa.googleapis.com"]
    assert to_api and {e["auth"] for e in to_api} == {"Bearer " + NEW_ACCESS}, to_api
    assert not any(s in out + err + reply + errors for s in REAL)
