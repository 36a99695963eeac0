"""network = "proxy" in a container agent (issue 12): the forwarder sits in
the engine's network namespace (only lo), so the agent's commands reach the
outside through the daemon's proxy the same way as in the namespace kind,
and nothing else. Real podman, the busybox image of test_container.py; the
servers and names of test_proxy.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_container import IMAGE, build_image
from test_proxy import CONFIG, LOOPBACK_PORT, OUTSIDE, configure
from test_proxy import bed as proxy_bed  # noqa: F401  (the servers and names)
from testbed import Testbed

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def cbed(proxy_bed: Testbed) -> Iterator[Testbed]:  # noqa: F811
    bed = proxy_bed
    build_image(bed)
    # The loopback server's port is opened as a proxy port here, so that
    # loop.test (127.0.0.1 by name) passes the name and port rules and only the
    # check of the address it resolves to stands between the agent and it.
    config = CONFIG.format(on_exceed="deny").replace(
        'kind = "namespace"', f'kind = "container"\nimage = "{IMAGE}"').replace(
        "ports = [22, 80, 443]", f"ports = [22, 80, 443, {LOOPBACK_PORT}]")
    assert str(LOOPBACK_PORT) in config
    bed.write_file("/etc/leviath/config.toml", config)
    bed.run(["systemctl", "restart", "leviathd"])
    bed.run(["mkdir", "-p", "cpw"], user="alice")
    yield bed
    configure(bed, "deny")


def run(bed: Testbed, script: str) -> tuple[int, str, str]:
    home = bed.users["alice"].home
    r = bed.run(["lev", "run", "--workdir", f"{home}/cpw", "--", "sh", "-c", script],
                user="alice", check=False, timeout=120)
    return r.returncode, r.stdout, r.stderr


def test_a_container_agent_reaches_an_allowed_domain_through_the_proxy(cbed: Testbed) -> None:
    rc, out, err = run(cbed, "echo $http_proxy; wget -q -O - http://allowed.test/hello.txt")
    assert rc == 0, out + err
    assert out == "http://127.0.0.1:3128\nhello from outside\n", out + err


# Each probe prints its name, its client's exit status and all it said, on one
# line: a refusal is read in its own words, never from a failure alone. (No
# `wget -T`: the bed's static busybox 1.35 is built without its timeout option
# but still parses -T, storing the number through a NULL pointer: every
# `wget -T N` dies of SIGSEGV (139) before it opens a socket, which a probe
# reading only "it failed" took for the refusal.) The controls run the same
# clients in the same container to allowed targets, so a broken client fails
# the test instead of passing it. `timeout` bounds each probe without -T.
NOPROXY = "env -u http_proxy -u HTTP_PROXY"
INNER_PORT = LOOPBACK_PORT + 1


def _via_proxy(url: str, host: str) -> str:
    """The request as a proxy client sends it, spoken by nc: the proxy's
    answer whole (a refusal's body names the rule that refused)."""
    return (f"sh -c 'printf \"GET {url} HTTP/1.0\\r\\nHost: {host}\\r\\n\\r\\n\" "
            "| nc 127.0.0.1 3128'")


PROBES = f"""
p() {{ n=$1; shift; o=$(timeout 20 "$@" 2>&1); r=$?; echo "$n rc=$r $o" | tr '\\r\\n' '  '; echo; }}
echo "ifs $(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ,)"
mkdir -p /tmp/www && echo inner-ok > /tmp/www/f
httpd -f -p 127.0.0.1:{INNER_PORT} -h /tmp/www & h=$!
i=0; until grep -q ":{INNER_PORT:04X} 00000000:0000 0A" /proc/net/tcp || [ $((i+=1)) -gt 200 ]
do sleep 0.05; done
p ctl-wget wget -q -O - http://allowed.test/hello.txt
p ctl-nc {_via_proxy("http://allowed.test/hello.txt", "allowed.test")}
p ctl-direct {NOPROXY} wget -q -O - http://127.0.0.1:{INNER_PORT}/f
p denied wget -q -O - http://denied.test/hello.txt
p denied-nc {_via_proxy("http://denied.test/hello.txt", "denied.test")}
p direct {NOPROXY} wget -q -O - http://{OUTSIDE}/hello.txt
p loopback {NOPROXY} wget -q -O - http://127.0.0.1:{LOOPBACK_PORT}/
p loop-name wget -q -O - http://loop.test:{LOOPBACK_PORT}/
p loop-name-nc {_via_proxy(f"http://loop.test:{LOOPBACK_PORT}/", "loop.test")}
kill $h
"""


def _probes(out: str) -> dict[str, str]:
    return {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] if " " in ln else ""
            for ln in out.splitlines()}


def test_a_container_agent_has_only_lo_and_nothing_but_the_proxy_gets_out(
    cbed: Testbed,
) -> None:
    """The attacker's side: a denied name, the outside address and the host's
    loopback service, without the proxy or through it by a name, all refused,
    each in its own words."""
    rc, out, err = run(cbed, PROBES)
    assert rc == 0, out + err
    got = _probes(out)
    assert got["ifs"] == "lo,", out
    # The controls: both clients work through the proxy, and wget without it.
    assert got["ctl-wget"].startswith("rc=0 hello from outside"), out + err
    assert "200" in got["ctl-nc"] and "hello from outside" in got["ctl-nc"], out + err
    assert got["ctl-direct"].startswith("rc=0 inner-ok"), out + err
    # The proxy's refusal by the name's rule (403, in leviathd's words).
    assert got["denied"].startswith("rc=1 ") and "403 Refused" in got["denied"], out
    assert "403" in got["denied-nc"] and "matches deny_domains" in got["denied-nc"], out
    # No route but lo: the kernel's answer, not a crash of the client.
    assert got["direct"].startswith("rc=1 ") and "Network is unreachable" in got["direct"], out
    # The container's lo is its own: nothing listens on the host's port there.
    assert got["loopback"].startswith("rc=1 ") and "Connection refused" in got["loopback"], out
    # A name for the host's loopback: refused by the address it resolves to.
    assert got["loop-name"].startswith("rc=1 ") and "403 Refused" in got["loop-name"], out
    assert "the host's loopback is reached only by" in got["loop-name-nc"], out
    assert "hello" not in got["denied"] + got["denied-nc"] + got["direct"], out
    assert "secret" not in out, out
