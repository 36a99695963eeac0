"""Issue 49, item 3: an agent's `docker pull` goes through its egress, and
the user's registry login is put in there, never given to the agent.

The registry is a STAND-IN for a real one (Docker Hub, ghcr.io, a company's
registry), which a test cannot reach: Debian's own `docker-registry` (2.8),
run in a network namespace of the test's (10.79.0.2, named registry.test,
other.test and denied-reg.test in the bed's /etc/hosts), with TLS from a
test CA the bed's system trust store holds and htpasswd basic auth. An image
is pushed to it from outside the agent (root's podman, with the login).

alice's `~/.docker/config.json` holds the login (hidden from the agent).
Inside the agent, as a user types it (the machine's docker CLI 28.2.2, no
flag): `docker pull` and `docker run` of the image work; the password is
nowhere the agent can read (its environment, files, `docker info`) nor in
its engine's storage and runtime folder (scanned as root while the agent
runs); a registry the egress policy denies is refused although alice has a
login for it. The attacker's side: the agent's own request with a forged
Authorization keeps its own header (the registry refuses it), and the same
registry under a name alice has no login for gets none.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from test_engine_clients import DOCKER_NEW, _host_docker, _value
from test_engine_rootless import MAKE_TARBALL, TARBALL
from testbed import Testbed

pytestmark = pytest.mark.testbed

WORK = "regw"
REG_USER = "alice-reg"
# What must never reach the agent: the password, and its login as the
# header carries it (base64 of user:password).
PASSWORD = "reg-pw-7f3c1e9a5b2d4c6e8f0a"
BASIC = base64.b64encode(f"{REG_USER}:{PASSWORD}".encode()).decode()
OUTSIDE = "10.79.0.2"
REGISTRY = "registry.test:5000"
IMAGE = f"{REGISTRY}/demo/bb:1"

# alice's login, as `docker login` writes it, for the registry and for the
# one the policy denies.
AUTHS = {"auths": {REGISTRY: {"auth": BASIC}, "https://denied-reg.test:5000": {"auth": BASIC}}}

HOSTS = f"""127.0.0.1 localhost
{OUTSIDE} registry.test other.test denied-reg.test
"""

CONFIG = """
[sandbox]
kind = "namespace"
network = "proxy"

[sandbox.containers]
enabled = true

[taint]
allow_private_addresses = true

[proxy]
deny_domains = ["denied-reg.test"]
ports = [80, 443, 5000]
"""

REGISTRY_CONFIG = f"""version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: /srv/reg/data
http:
  addr: {OUTSIDE}:5000
  tls:
    certificate: /srv/reg/tls.pem
    key: /srv/reg/tls.key
auth:
  htpasswd:
    realm: stand-in
    path: /srv/reg/htpasswd
"""

# Runs inside the agent, as alice types it. Its last step waits for the
# test's scan of the engine's storage (a file the test makes in the
# workdir), so the engine is still there to be scanned.
CURL = "curl -s -o /dev/null -w '%{http_code}' --max-time 20"
SCRIPT = f"""
D={DOCKER_NEW}
echo "pull=$($D pull {IMAGE} 2>&1 | tail -n 1)"
echo "run=$($D run --rm {IMAGE} echo ran-from-the-registry 2>&1 | tr '\\n' ' ')"
echo "denied=$($D pull denied-reg.test:5000/demo/bb:1 2>&1 | tr '\\n' ' ')"
echo "login=$(echo agent-pw | $D login -u agent --password-stdin {REGISTRY} 2>&1 \
  | tr '\n' ' ')"
echo "pull-after-login=$($D pull {IMAGE} 2>&1 | tail -n 1)"
$D info > info.txt 2>&1
env > env.txt
echo "secret-in-files=$(grep -rlsF -e '{PASSWORD}' -e '{BASIC}' $HOME /tmp /var/tmp /run \\
  /etc /dev/shm 2>/dev/null | grep -v -e '/env.txt$' -e '/info.txt$' | tr '\\n' ,)"
echo "secret-in-env=$(grep -cF -e '{PASSWORD}' -e '{BASIC}' env.txt)"
echo "secret-in-info=$(grep -cF -e '{PASSWORD}' -e '{BASIC}' info.txt)"
echo "docker-config=$(cat $HOME/.docker/config.json 2>&1 | head -c 200)"
B=/run/leviath/ca-bundle.pem
echo "bare=$({CURL} --cacert $B https://{REGISTRY}/v2/)"
echo "forged=$({CURL} --cacert $B -H 'Authorization: Basic Zm9yZ2VkOm5vcGU=' \\
  https://{REGISTRY}/v2/)"
echo "push=$({CURL} --cacert $B -X POST https://{REGISTRY}/v2/demo/bb/blobs/uploads/)"
echo "delete=$({CURL} --cacert $B -X DELETE https://{REGISTRY}/v2/demo/bb/manifests/1)"
echo "other=$({CURL} https://other.test:5000/v2/)"
echo "other-as-registry=$({CURL} -H 'Host: {REGISTRY}' https://other.test:5000/v2/)"
touch scan-now
i=0; while [ ! -e scanned ] && [ $i -lt 600 ]; do sleep 0.5; i=$((i+1)); done
echo "left=$($D ps -a -q | wc -l)"
"""


@pytest.fixture(scope="module")
def rbed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    if bed.run(["sh", "-c", "command -v docker-registry && command -v htpasswd"],
               check=False).returncode != 0:
        pytest.fail("the bed has no docker-registry or htpasswd (scripts/setup installs "
                    "docker-registry and apache2-utils)")
    path, _version = _host_docker()
    bed.copy_in(path, DOCKER_NEW, mode=0o755)
    old_hosts = bed.read_file("/etc/hosts")
    old_config = bed.run("cat /etc/leviath/config.toml 2>/dev/null", check=False).stdout
    home = bed.users["alice"].home
    bed.run(f"""
        set -e
        ip netns del lvreg 2>/dev/null || true
        ip link del lvrh 2>/dev/null || true
        ip netns add lvreg
        ip link add lvrh type veth peer name lvrs netns lvreg
        ip addr add 10.79.0.1/24 dev lvrh
        ip link set lvrh up
        ip netns exec lvreg ip addr add {OUTSIDE}/24 dev lvrs
        ip netns exec lvreg ip link set lvrs up
        ip netns exec lvreg ip link set lo up
        rm -rf /srv/reg && mkdir -p /srv/reg/data && cd /srv/reg
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=regtestca \\
            -keyout ca.key -out ca.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj /CN=registry.test -keyout tls.key \\
            -out tls.csr 2>/dev/null
        printf 'subjectAltName=DNS:registry.test,DNS:other.test,DNS:denied-reg.test\\n' \\
            > san.ext
        openssl x509 -req -in tls.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \\
            -extfile san.ext -out tls.pem 2>/dev/null
        cp ca.pem /usr/local/share/ca-certificates/leviath-regtest.crt
        update-ca-certificates >/dev/null 2>&1
        htpasswd -Bbn {REG_USER} {PASSWORD} > htpasswd
    """)
    bed.write_file("/etc/hosts", HOSTS)
    bed.write_file("/srv/reg/config.yml", REGISTRY_CONFIG)
    pid = bed.run("setsid ip netns exec lvreg docker-registry serve /srv/reg/config.yml "
                  ">/srv/reg/err 2>&1 </dev/null & echo $!").stdout.strip()
    try:
        bed.run(f"for i in $(seq 100); do [ \"$(curl -s -o /dev/null -w '%{{http_code}}' "
                f"https://{REGISTRY}/v2/)\" = 401 ] && exit 0; sleep 0.1; done; "
                "cat /srv/reg/err; exit 1")
        # The image, pushed from outside any agent with the login.
        r = bed.run(["sh", "-c", MAKE_TARBALL, "sh", f"/srv/reg/{TARBALL}"], check=False,
                    timeout=180)
        assert r.returncode == 0, r.stderr
        bed.run(["podman", "import", "-q", f"/srv/reg/{TARBALL}", IMAGE], timeout=180)
        bed.run(["podman", "push", "-q", "--creds", f"{REG_USER}:{PASSWORD}", IMAGE],
                timeout=180)
        bed.run(["podman", "rmi", "-f", IMAGE], check=False)
        bed.run(["mkdir", "-p", f"{home}/.docker", f"{home}/{WORK}"], user="alice")
        bed.write_file(f"{home}/.docker/config.json", json.dumps(AUTHS), mode=0o600)
        bed.run(["chown", "-R", "alice:", f"{home}/.docker", f"{home}/{WORK}"])
        bed.write_file("/etc/leviath/config.toml", CONFIG)
        bed.run(["systemctl", "restart", "leviathd"])
        yield bed
    finally:
        bed.run(["kill", pid], check=False)
        bed.run("ip netns del lvreg; rm -f /usr/local/share/ca-certificates/leviath-regtest.crt"
                " && update-ca-certificates --fresh >/dev/null 2>&1", check=False)
        bed.write_file("/etc/hosts", old_hosts)
        bed.run(["rm", "-rf", f"{home}/.docker", f"{home}/{WORK}"], check=False)
        # The next module finds the machine config as this one did.
        bed.write_file("/etc/leviath/config.toml", old_config)
        bed.run(["systemctl", "restart", "leviathd"])


def _when_scannable(bed: Testbed, proc: subprocess.Popen[str], work: str) -> str:
    """The agent's id once it has pulled and probed (its `scan-now` in the
    workdir); its engine is then still there to be scanned."""
    while bed.run(["test", "-e", f"{work}/scan-now"], check=False).returncode != 0:
        if proc.poll() is not None:
            raise AssertionError(f"lev run ended early: {proc.communicate()}")
        time.sleep(0.5)
    rows = json.loads(bed.run(["lev", "ps", "--json"], user="alice").stdout)
    ids = [str(r["id"]) for r in rows if SCRIPT.strip()[:20] in " ".join(r["command"])]
    assert len(ids) == 1, rows
    return ids[0]


def test_a_pull_from_a_registry_gets_the_users_login_at_the_egress_and_the_agent_never_sees_it(
        rbed: Testbed) -> None:
    bed = rbed
    home = bed.users["alice"].home
    work = f"{home}/{WORK}"
    proc = subprocess.Popen(bed.command(["lev", "run", "--", "sh", "-c", SCRIPT],
                                        user="alice", cwd=work),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        agent_id = _when_scannable(bed, proc, work)
        scan = bed.run(["grep", "-rlsF", "-e", PASSWORD, "-e", BASIC,
                        f"/var/lib/leviath/engine-storage/{agent_id}",
                        f"/run/leviath/engine-user/{agent_id}"], check=False)
        images = bed.run(["sh", "-c", f"ls /var/lib/leviath/engine-storage/{agent_id}/storage "
                          "| head -3"], check=False).stdout
        bed.run(["touch", f"{work}/scanned"], user="alice")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(out, err, scan.stdout, images)
    assert proc.returncode == 0, (out, err)
    # As typed: the pull and the run work, with the login put in at the egress.
    assert "Error" not in _value(out, "pull") and "bb:1" in _value(out, "pull"), (out, err)
    assert "ran-from-the-registry" in _value(out, "run"), (out, err)
    # The engine's storage was there (the scan saw it) and holds no login.
    assert images.strip(), images
    assert scan.stdout.strip() == "", scan.stdout
    # Nowhere inside the agent: files it can read, environment, docker info;
    # its ~/.docker is not the user's.
    assert _value(out, "secret-in-files") == "", out
    assert _value(out, "secret-in-env") == "0", out
    assert _value(out, "secret-in-info") == "0", out
    assert "auths" not in _value(out, "docker-config"), out
    # A registry the egress policy denies is refused, login or not.
    denied = _value(out, "denied")
    assert "denied-reg.test" in denied and ("403" in denied or "Refused" in denied), out
    # The agent may use the login toward that registry (its own request with
    # no Authorization gets it), never read it; its own forged header is kept.
    assert _value(out, "bare") == "200", out
    assert _value(out, "forged") == "401", out
    # Reads only: a blob upload or a delete by the agent's own curl gets no
    # login (the registry answers 401), never writes to alice's registry.
    assert _value(out, "push") == "401" and _value(out, "delete") == "401", out
    # The same registry under a name alice has no login for: none given,
    # whatever Host header the agent sends.
    assert _value(out, "other") == "401", out
    assert _value(out, "other-as-registry") == "401", out
    assert _value(out, "left") == "0", out
    # A `docker login` inside the agent is the agent's: the user's file is
    # as it was, and her login still serves the pull.
    assert json.loads(bed.read_file(f"{home}/.docker/config.json")) == AUTHS, _value(out, "login")
    assert "bb:1" in _value(out, "pull-after-login"), out
