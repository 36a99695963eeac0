"""Issue 49, item 1: an agent's containers reach the network through the
agent's egress, and only through it. Behind the proxy (`network = "proxy"`,
the default) the agent's engine (its user's rootless podman) runs in the
agent's own network namespace, and a container started as a user types it
(`docker run IMAGE wget URL`, no flags) shares that namespace with the
agent's proxy variables: an allowed host answers through the agent's proxy;
from the same container, the attacker's side, a denied name, a direct
connection to the outside address and the host's loopback service fail as
they fail for the agent. The servers and names are test_proxy.py's (its
outside network namespace is the stand-in for the internet); the client is
this machine's docker CLI 28.2.2 (test_engine_clients.py copies it in).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_engine_clients import DOCKER_NEW, _host_docker, _value
from test_engine_rootless import IMAGE, MAKE_TARBALL, TARBALL
from test_proxy import CONFIG, LOOPBACK_PORT, OUTSIDE, configure
from test_proxy import bed as proxy_bed  # noqa: F401  (the servers and names)
from testbed import Testbed

pytestmark = pytest.mark.testbed

WORK = "egw"


@pytest.fixture(scope="module")
def ebed(proxy_bed: Testbed) -> Iterator[Testbed]:  # noqa: F811
    bed = proxy_bed
    path, _version = _host_docker()
    bed.copy_in(path, DOCKER_NEW, mode=0o755)
    home = bed.users["alice"].home
    bed.run(["mkdir", "-p", WORK], user="alice")
    r = bed.run(["sh", "-c", MAKE_TARBALL, "sh", f"{home}/{WORK}/{TARBALL}"], check=False,
                timeout=180)
    assert r.returncode == 0, r.stderr
    bed.run(["chown", "-R", "alice:", f"{home}/{WORK}"])
    bed.write_file("/etc/leviath/config.toml", CONFIG.format(on_exceed="deny")
                   + "\n[sandbox.containers]\nenabled = true\n")
    bed.run(["systemctl", "restart", "leviathd"])
    yield bed
    configure(bed, "deny")


# Each probe's words are read, not its status: podman 4.3 answers the docker
# CLI's `run --rm` (its wait for "removed") with 0 whatever the command's.
# (No `wget -T`: the bed's static busybox 1.35 segfaults on it, which a probe
# that only checks for a failure would take for a refusal.)
# Each probe a plain `docker run --rm IMAGE ...`; where the test takes the
# proxy away, with the user's own empty -e (what an attacker would type).
NOPROXY = "-e http_proxy= -e HTTP_PROXY= -e all_proxy= -e ALL_PROXY="
SCRIPT = f"""
D={DOCKER_NEW}
$D import {TARBALL} {IMAGE} >/dev/null || echo import-failed
echo "agent-ifs=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ,)"
echo "allowed=$($D run --rm {IMAGE} wget -q -O - http://allowed.test/hello.txt)"
echo "env=$($D run --rm {IMAGE} sh -c 'echo $http_proxy $HTTPS_PROXY')"
echo "ifs=$($D run --rm {IMAGE} sh -c "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' \\
  | tr '\\n' ,")"
echo "routes=$($D run --rm {IMAGE} sh -c 'tail -n +2 /proc/net/route | wc -l')"
probe() {{ echo "$1=$(shift; $D run --rm "$@" 2>&1 | tr '\\n' ' ')"; }}
probe denied {IMAGE} wget -q -O - http://denied.test/hello.txt
probe direct {NOPROXY} {IMAGE} wget -q -O - http://{OUTSIDE}/hello.txt
probe loopback {NOPROXY} {IMAGE} wget -q -O - http://127.0.0.1:{LOOPBACK_PORT}/
probe loop-name {IMAGE} wget -q -O - http://loop.test:{LOOPBACK_PORT}/
$D run --rm --network host {IMAGE} true; echo "host=$?"
$D run --rm -p 8080:80 {IMAGE} true; echo "publish=$?"
mkdir -p ctx && printf 'FROM {IMAGE}\nRUN wget -q -O - http://allowed.test/hello.txt\n' \
  > ctx/Dockerfile
DOCKER_BUILDKIT=0 $D build -q --no-cache ctx >/dev/null 2>build.err && echo build-ok
echo "pull-denied=$($D pull denied.test/x:1 2>&1 | tr '\\n' ' ')"
echo "pull-allowed=$($D pull allowed.test/x:1 2>&1 | tr '\\n' ' ')"
echo "left=$($D ps -a -q | wc -l)"
"""


def test_a_container_reaches_allowed_hosts_through_the_agents_proxy_and_nothing_else(
        ebed: Testbed) -> None:
    home = ebed.users["alice"].home
    r = ebed.run(["lev", "run", "--", "sh", "-c", SCRIPT], user="alice", cwd=f"{home}/{WORK}",
                 check=False, timeout=300)
    out, err = r.stdout, r.stderr
    assert r.returncode == 0, (out, err)
    assert "import-failed" not in out, err
    # Through the agent's proxy, as typed: the stand-in's answer.
    assert _value(out, "allowed") == "hello from outside", (out, err)
    assert _value(out, "env") == "http://127.0.0.1:3128 http://127.0.0.1:3128", out
    # The container's network is the agent's: only lo, not a route more.
    assert _value(out, "agent-ifs") == "lo,", out
    assert _value(out, "ifs") == "lo,", out
    assert _value(out, "routes") == "0", out
    # The attacker's side, from the container: what the agent cannot reach.
    # (the proxy's refusal; no route; nothing listens on the agent's own lo)
    assert "403" in _value(out, "denied"), (out, err)
    assert "Network is unreachable" in _value(out, "direct"), (out, err)
    assert "Connection refused" in _value(out, "loopback"), (out, err)
    assert "403" in _value(out, "loop-name"), (out, err)
    # A build's RUN step as typed: the same way out (the agent's proxy as build args).
    assert "build-ok" in out, (out, err)
    # The engine's own pulls go through the agent's egress too: a denied
    # registry name gets the proxy's refusal, an allowed one reaches the
    # stand-in's TLS (whose test CA the engine does not trust: no registry
    # here), never "network is unreachable".
    assert "Refused" in _value(out, "pull-denied"), out
    assert "x509" in _value(out, "pull-allowed"), out
    assert "unreachable" not in _value(out, "pull-denied") + _value(out, "pull-allowed"), out
    assert "secret" not in out, out
    # What would give a container another network says why.
    assert _value(out, "host") != "0" and "--network host is not allowed" in err, err
    assert _value(out, "publish") != "0", out
    assert "the agent's own 127.0.0.1:PORT" in err, err
    assert _value(out, "left") == "0", out
