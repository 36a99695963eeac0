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
    config = CONFIG.format(on_exceed="deny").replace(
        'kind = "namespace"', f'kind = "container"\nimage = "{IMAGE}"')
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


def test_a_container_agent_has_only_lo_and_nothing_but_the_proxy_gets_out(
    cbed: Testbed,
) -> None:
    """The attacker's side: a denied name, the outside address and the host's
    loopback service without the proxy all fail."""
    rc, out, err = run(cbed, (
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; "
        "wget -q -T 5 -O - http://denied.test/hello.txt && echo DENIED-PASSED; "
        f"env -u http_proxy -u HTTP_PROXY wget -q -T 5 -O - http://{OUTSIDE}/hello.txt "
        "&& echo DIRECT-PASSED; "
        f"env -u http_proxy -u HTTP_PROXY wget -q -T 5 -O - http://127.0.0.1:{LOOPBACK_PORT}/ "
        "&& echo LOOPBACK-PASSED; "
        f"wget -q -T 5 -O - http://loop.test:{LOOPBACK_PORT}/ && echo LOOP-NAME-PASSED; "
        "true"))
    assert rc == 0, err
    assert out.split()[0] == "lo" and "PASSED" not in out and "secret" not in out, out + err

