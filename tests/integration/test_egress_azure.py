"""Issue 30 item 5, from inside a real agent: a `kind = "azure"` service
principal. The real `az` (Debian's azure-cli, installed by scripts/setup)
runs in the agent; its client secret and the bearer tokens obtained with it
stay in the daemon.

Azure itself cannot be had here: its token and management endpoints are
STAND-INS, real TLS servers in a network namespace of the test's ("outside",
10.79.0.2, reached through `[proxy] private_ranges`) under the real names
(login.microsoftonline.com and management.azure.com in the bed's /etc/hosts),
their certificate from a test CA installed in the bed's system trust store.
The stand-in authority issues a token only for the real client secret; the
stand-in management host answers only that token and records the
Authorization header it gets, as does other.test (a host no credential
covers). bad.management.test:8443 is a covered management host whose
certificate is self-signed.

On the code before this change the config did not load (no kind "azure"):
az had no login at all inside, and the only way to give it one was the
secret itself (seen failing)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from loop_agent import lay_out, start_detached
from test_egress_credentials import answering
from test_gate_bed import Agent, lev
from testbed import Testbed

pytestmark = pytest.mark.testbed

OUTSIDE = "10.79.0.2"
TENANT = "11111111-2222-3333-4444-555555555555"
CLIENT = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
SUB = "99999999-8888-7777-6666-555555555555"
SECRET = "azsp-5ecret-f00dcafe"
TOKEN = "azrealtok-5ecret"  # the stand-in authority's tokens: this, a dash, a count

BLUEPRINT = """
[agent]
name = "azegress"
description = "runs the test's commands"
command = ["sh", "loop.sh"]
"""

CONFIG = f"""
[sandbox]
kind = "namespace"

[proxy]
private_ranges = ["10.79.0.0/24"]
ports = [443, 8443]

[credentials.az]
kind = "azure"
tenant = "{TENANT}"
client_id = "{CLIENT}"
hosts = ["management.azure.com", "bad.management.test:8443"]
secret_file = "/etc/leviath/az-sp.secret"

# The same app, its tokens asked of an authority whose certificate does not
# verify (the self-signed server): no token, so nothing for mgmt2.test.
[credentials.azbad]
kind = "azure"
tenant = "{TENANT}"
client_id = "{CLIENT}"
authority = "bad.management.test:8443"
hosts = ["mgmt2.test"]
secret_file = "/etc/leviath/az-sp.secret"
"""

HOSTS = f"""127.0.0.1 localhost
{OUTSIDE} login.microsoftonline.com management.azure.com other.test bad.management.test
{OUTSIDE} mgmt2.test
"""

# The stand-ins: one HTTPS server per port; the Host header says which.
SERVER = f"""
import http.server, itertools, json, ssl, threading, urllib.parse

TENANT, CLIENT, SUB, SECRET = {TENANT!r}, {CLIENT!r}, {SUB!r}, {SECRET!r}
issued = itertools.count(1)
tokens = set()

def log(entry):
    with open("/srv/az/log.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\\n")

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        # The handshake in this request's thread, not in the accepting one: a
        # connection the proxy made and has not yet spoken TLS on (while the
        # daemon fetches the token from this same server) holds up no other.
        self.request.do_handshake()
        super().setup()

    def reply(self, status, obj):
        body = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def serve(self):
        host = self.headers.get("Host", "").split(":")[0]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        auth = self.headers.get("Authorization", "")
        path = self.path.partition("?")[0]
        log({{"host": host, "port": self.server.server_address[1], "method": self.command,
             "path": path, "auth": auth, "body": body}})
        if host == "login.microsoftonline.com":
            base = "https://login.microsoftonline.com/" + TENANT
            if path.endswith("/.well-known/openid-configuration"):
                return self.reply(200, {{
                    "token_endpoint": base + "/oauth2/v2.0/token",
                    "authorization_endpoint": base + "/oauth2/v2.0/authorize",
                    "device_authorization_endpoint": base + "/oauth2/v2.0/devicecode",
                    "issuer": "https://login.microsoftonline.com/" + TENANT + "/v2.0",
                    "end_session_endpoint": base + "/oauth2/v2.0/logout"}})
            if path == "/common/discovery/instance":
                return self.reply(200, {{"tenant_discovery_endpoint":
                    base + "/v2.0/.well-known/openid-configuration", "api-version": "1.1",
                    "metadata": []}})
            form = urllib.parse.parse_qs(body)
            if path == "/" + TENANT + "/oauth2/v2.0/token" and \\
                    form.get("client_secret") == [SECRET] and form.get("client_id") == [CLIENT]:
                tok = "{TOKEN}-%d" % next(issued)
                tokens.add(tok)
                return self.reply(200, {{"token_type": "Bearer", "expires_in": 3600,
                                        "ext_expires_in": 3600, "access_token": tok}})
            return self.reply(401, {{"error": "invalid_client",
                                    "error_description": "AADSTS7000215: stand-in says no"}})
        if host == "management.azure.com":
            if auth.partition(" ")[2] not in tokens:
                return self.reply(401, {{"error": {{"code": "InvalidAuthenticationToken",
                                                  "message": "stand-in: not a token of ours"}}}})
            if path == "/echo":  # a host that says back what it got
                return self.reply(200, {{"authorization": auth}})
            if path == "/subscriptions":
                return self.reply(200, {{"value": [{{
                    "id": "/subscriptions/" + SUB, "subscriptionId": SUB, "tenantId": TENANT,
                    "displayName": "stand-in subscription", "state": "Enabled",
                    "subscriptionPolicies": {{"locationPlacementId": "Public_2014-09-01",
                                              "quotaId": "x", "spendingLimit": "Off"}},
                    "authorizationSource": "RoleBased"}}]}})
            if path == "/tenants":
                return self.reply(200, {{"value": [{{"id": "/tenants/" + TENANT,
                                                    "tenantId": TENANT}}]}})
            if path.lower() == "/subscriptions/" + SUB + "/resourcegroups":
                return self.reply(200, {{"value": [{{
                    "id": "/subscriptions/" + SUB + "/resourceGroups/rg-standin",
                    "name": "rg-standin", "type": "Microsoft.Resources/resourceGroups",
                    "location": "westeurope",
                    "properties": {{"provisioningState": "Succeeded"}}}}]}})
            return self.reply(404, {{"error": {{"code": "NotFound", "message": path}}}})
        return self.reply(200, b"hello from " + host.encode() + b"\\n")

    do_GET = do_POST = serve

    def log_message(self, *args):
        pass

def run(port, pem, key):
    srv = http.server.ThreadingHTTPServer(("{OUTSIDE}", port), H)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pem, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True, do_handshake_on_connect=False)
    srv.serve_forever()

threading.Thread(target=run, args=(8443, "/srv/az/bad.pem", "/srv/az/bad.key"),
                 daemon=True).start()
run(443, "/srv/az/tls.pem", "/srv/az/tls.key")
"""


def log(bed: Testbed) -> list[dict[str, str]]:
    out = bed.run(["cat", "/srv/az/log.jsonl"], check=False).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def agent(testbed: Testbed) -> Iterator[Agent]:
    bed = testbed
    if not bed.run("command -v az", check=False).stdout.strip():
        pytest.fail("az is not installed (scripts/setup installs Debian's azure-cli)")
    old_config = bed.run("cat /etc/leviath/config.toml 2>/dev/null", check=False).stdout
    old_hosts = bed.read_file("/etc/hosts")
    lay_out(bed, "azw", "azbp", BLUEPRINT)
    bed.run(f"""
        set -e
        ip netns del lvaz 2>/dev/null || true
        ip link del lvazh 2>/dev/null || true
        ip netns add lvaz
        ip link add lvazh type veth peer name lvazs netns lvaz
        ip addr add 10.79.0.1/24 dev lvazh
        ip link set lvazh up
        ip netns exec lvaz ip addr add {OUTSIDE}/24 dev lvazs
        ip netns exec lvaz ip link set lvazs up
        ip netns exec lvaz ip link set lo up
        rm -rf /srv/az && mkdir -p /srv/az && cd /srv/az
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=aztestca \
            -keyout ca.key -out ca.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj /CN=management.azure.com -keyout tls.key \
            -out tls.csr 2>/dev/null
        printf 'subjectAltName=DNS:%s,DNS:%s,DNS:%s,DNS:%s\\n' login.microsoftonline.com \
            management.azure.com other.test mgmt2.test > san.ext
        openssl x509 -req -in tls.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
            -extfile san.ext -out tls.pem 2>/dev/null
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bad.management.test \
            -addext subjectAltName=DNS:bad.management.test -keyout bad.key -out bad.pem \
            2>/dev/null
        cp ca.pem /usr/local/share/ca-certificates/leviath-aztest.crt
        update-ca-certificates >/dev/null 2>&1
    """)
    bed.write_file("/etc/hosts", HOSTS)
    bed.write_file("/srv/az/server.py", SERVER)
    bed.write_file("/etc/leviath/az-sp.secret", SECRET + "\n", mode=0o600)
    pid = bed.run("setsid ip netns exec lvaz python3 /srv/az/server.py >/srv/az/server.err "
                  "2>&1 </dev/null & echo $!").stdout.strip()
    bed.run("for i in $(seq 100); do curl -fs https://other.test/ready >/dev/null && exit 0; "
            "sleep 0.1; done; cat /srv/az/server.err; exit 1")
    bed.run("rm -f /srv/az/log.jsonl")
    bed.write_file("/etc/leviath/config.toml", CONFIG)
    bed.run(["systemctl", "restart", "leviathd"])
    a = Agent(bed, "alice", start_detached(bed, "azbp", "azw"), f"{bed.users['alice'].home}/azw")
    try:
        with answering(bed, a):
            yield a
    finally:
        bed.run(["kill", pid], check=False)
        bed.run("ip netns del lvaz; rm -f /usr/local/share/ca-certificates/leviath-aztest.crt"
                " && update-ca-certificates --fresh >/dev/null 2>&1", check=False)
        bed.write_file("/etc/hosts", old_hosts)
        bed.write_file("/etc/leviath/config.toml", old_config)
        bed.run(["systemctl", "restart", "leviathd"])


# Inside the agent, while az signs in and lists the resource groups: every
# place the agent's user can read that might hold the secret or a token. The
# patterns are split by an empty quote so that this script's own file (in
# the workdir) does not match them.
S, T = f'{SECRET[:5]}""{SECRET[5:]}', f'{TOKEN[:5]}""{TOKEN[5:]}'
SNOOP = f"""
az group list --query '[].name' -o tsv > groups.out 2> groups.err &
job=$!
hits=""
while kill -0 $job 2>/dev/null; do
  for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
    grep -q -a -e {S} -e {T} "$f" 2>/dev/null && hits="$hits $f"
  done
done
wait $job; echo "az=$?"
cat groups.out
env | grep -c -e {S} -e {T}
grep -r -l -a -e {S} -e {T} "$HOME" . /tmp /run/leviath 2>/dev/null | head
echo "hits:$hits"
"""


def test_az_works_inside_and_neither_secret_nor_token_is_anywhere_the_agent_can_read(
        testbed: Testbed, agent: Agent) -> None:
    rc, out, err = agent.call(SNOOP, timeout=120)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "az=0", (out, err, agent.call("cat groups.err")[1])
    assert lines[1] == "rg-standin", (out, err)
    # No variable, no file (the grep lists none) and no /proc entry holds either.
    assert lines[2:] == ["0", "hits:"], out
    assert SECRET not in out + err and TOKEN not in out + err
    # az's own login state inside holds only placeholders.
    rc, out, err = agent.call("cat ~/.azure/*.json; az account show -o json")
    assert rc == 0, err
    assert SECRET not in out and TOKEN not in out and "leviath-placeholder-" in out, out
    assert SUB in out
    seen = log(testbed)
    manage = [e for e in seen if e["host"] == "management.azure.com"]
    assert manage and all(e["auth"].startswith(f"Bearer {TOKEN}-") for e in manage), manage
    # The secret reached the authority only from the daemon; the agent's
    # sign-in (with the placeholder) never left the proxy.
    logins = [e for e in seen if e["path"].endswith("/oauth2/v2.0/token")]
    assert logins and all(f"client_secret={SECRET}" in e["body"] for e in logins), logins


def test_tokens_are_fetched_once_and_cached(testbed: Testbed, agent: Agent) -> None:
    for _ in range(2):
        rc, out, err = agent.call("az group list --query '[].name' -o tsv", timeout=120)
        assert rc == 0 and out == "rg-standin\n", (out, err)
    logins = [e for e in log(testbed) if e["path"].endswith("/oauth2/v2.0/token")]
    assert len(logins) == 1, logins


def test_the_agents_token_is_a_placeholder_worthless_elsewhere(testbed: Testbed,
                                                               agent: Agent) -> None:
    """What az hands out is what the daemon answered: a placeholder. Sent to
    a host no credential covers, it is all that host gets."""
    rc, out, err = agent.call(
        "tok=$(az account get-access-token --query accessToken -o tsv); echo $tok; "
        'curl -fsS https://other.test/x -H "Authorization: Bearer $tok"; '
        'curl -fsS "https://management.azure.com/subscriptions?api-version=2020-01-01" '
        '-H "Authorization: Bearer $tok"', timeout=120)
    assert rc == 0, (out, err)
    tok = out.splitlines()[0]
    assert tok.count(".") == 2 and "leviath-placeholder-" in tok, out
    assert TOKEN not in out + err and SECRET not in out + err
    assert "hello from other.test" in out and SUB in out, out
    other = [e for e in log(testbed) if e["host"] == "other.test" and e["path"] == "/x"]
    assert other and all(e["auth"] == f"Bearer {tok}" for e in other), other


def test_a_management_host_whose_certificate_does_not_verify_gets_no_token(
        testbed: Testbed, agent: Agent) -> None:
    rc, out, err = agent.call("curl -sS https://bad.management.test:8443/x "
                              '-H "Authorization: Bearer placeholder-or-not"')
    assert "does not verify" in out and "no credential was sent" in out, (rc, out, err)
    assert not [e for e in log(testbed) if e["port"] == 8443]


def test_an_authority_whose_certificate_does_not_verify_gets_no_secret(
        testbed: Testbed, agent: Agent) -> None:
    """The daemon's own sign-in checks the authority as the proxy checks a
    host: a self-signed one gets no TLS session, so neither the secret nor
    a request; the agent is told why."""
    rc, out, err = agent.call("curl -sS https://mgmt2.test/x")
    assert "credential 'azbad' is unavailable" in out and "does not verify" in out, (
        rc, out, err)
    assert SECRET not in out + err
    assert not [e for e in log(testbed) if e["port"] == 8443 or e["host"] == "mgmt2.test"]


def test_another_sign_in_to_the_tenant_is_not_sent_on(testbed: Testbed, agent: Agent) -> None:
    """A guess at the secret (or any other login to the credential's tenant)
    is answered by the proxy, never by the authority: the agent cannot use
    the daemon's connection to probe it."""
    rc, out, err = agent.call(
        f"curl -sS https://login.microsoftonline.com/{TENANT}/oauth2/v2.0/token "
        f"-d client_id={CLIENT} -d client_secret=a-guess -d grant_type=client_credentials "
        "-d scope=https://management.azure.com/.default")
    assert "answered by leviathd" in out, (rc, out, err)
    assert not [e for e in log(testbed) if "a-guess" in e["body"]]


def test_audit_and_inspect_name_the_credential_and_its_hosts(testbed: Testbed,
                                                             agent: Agent) -> None:
    out = lev(testbed, "alice", "inspect", agent.id).stdout
    assert ("credential az (kind azure): injected at the proxy toward management.azure.com, "
            "bad.management.test:8443 (Authorization: Bearer") in out, out
    assert SECRET not in out and TOKEN not in out
    out = testbed.run(["journalctl", "--no-pager", "-o", "json", f"LEVIATH_AGENT={agent.id}",
                       "LEVIATH_TOOL=network"]).stdout
    assert SECRET not in out and TOKEN not in out
    recs = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert any(r.get("LEVIATH_RULE") == "credential az" and "/resourcegroups" in
               (str(r.get("MESSAGE", "")) + str(r.get("LEVIATH_DETAIL", ""))).lower()
               for r in recs), recs


def test_a_covered_host_that_echoes_the_token_echoes_only_a_mask(testbed: Testbed,
                                                                 agent: Agent) -> None:
    """The token is in no byte the agent receives, even from a covered host
    that says the request's Authorization header back (ARM does not; a
    host added to `hosts` might): the proxy masks it in the answer."""
    rc, out, err = agent.call(
        "tok=$(az account get-access-token --query accessToken -o tsv); "
        'curl -fsS https://management.azure.com/echo -H "Authorization: Bearer $tok"',
        timeout=120)
    assert rc == 0, (out, err)
    assert TOKEN not in out + err, out
    assert json.loads(out)["authorization"].startswith("Bearer "), out
    echo = [e for e in log(testbed) if e["path"] == "/echo"]
    assert echo and echo[-1]["auth"].startswith(f"Bearer {TOKEN}-"), echo


def test_after_a_daemon_restart_az_still_works(testbed: Testbed, agent: Agent) -> None:
    """The adopted agent's proxy is rebuilt from its snapshot (a new CA,
    the same placeholders, an empty token cache): az, already signed in
    with the placeholder token, goes on working."""
    before = len([e for e in log(testbed) if e["path"].endswith("/oauth2/v2.0/token")])
    testbed.run(["systemctl", "restart", "leviathd"])
    rc, out, err = agent.call("az group list --query '[].name' -o tsv", timeout=120)
    assert rc == 0 and out == "rg-standin\n", (out, err)
    after = [e for e in log(testbed) if e["path"].endswith("/oauth2/v2.0/token")]
    assert len(after) == before + 1, after
