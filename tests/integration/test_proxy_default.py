"""Issue 30, item 0, from inside a real agent: with no `network` in any
config a namespace agent is behind the proxy, so the host's loopback
services are out of its reach (on the code before this change the default
was the host's network and the agent read them: seen failing); a port the
machine config opens with `[proxy] host_ports` is reachable through the
proxy, by `localhost` or `host.leviath.internal`, and a port it does not
open is refused with a message naming the setting."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from loop_agent import lay_out, start_detached
from test_gate_bed import Agent, lev
from testbed import Testbed

pytestmark = pytest.mark.testbed

CLOSED_PORT = 18471  # a host service nobody opened
OPEN_PORT = 18472  # the "dev server" the machine config opens

BLUEPRINT = """
[agent]
name = "defaultnet"
description = "runs the test's commands"
command = ["sh", "loop.sh"]
"""

# No `network` anywhere: the built-in default applies.
CONFIG = f"""
[sandbox]
kind = "namespace"

[proxy]
host_ports = [{OPEN_PORT}]
"""


def curl(url: str, *extra: str) -> str:
    return f"curl -sS --max-time 10 {' '.join(extra)} {url}"


@pytest.fixture(scope="module")
def agent(testbed: Testbed) -> Iterator[Agent]:
    bed = testbed
    lay_out(bed, "dnw", "dnbp", BLUEPRINT)
    bed.run("rm -rf /srv/closed /srv/open && mkdir -p /srv/closed /srv/open && "
            "printf 'closed host service\\n' > /srv/closed/index.html && "
            "printf 'dev server\\n' > /srv/open/index.html")
    # Started and ended inside the bed by pid (killing nsenter would leave them).
    pids = [bed.run(f"setsid python3 -m http.server {port} --bind 127.0.0.1 --directory {d} "
                    ">/dev/null 2>&1 </dev/null & echo $!").stdout.strip()
            for port, d in ((CLOSED_PORT, "/srv/closed"), (OPEN_PORT, "/srv/open"))]
    old = bed.run("cat /etc/leviath/config.toml 2>/dev/null", check=False).stdout
    bed.write_file("/etc/leviath/config.toml", CONFIG)
    bed.run(["systemctl", "restart", "leviathd"])
    bed.run(["sh", "-c", f"for i in $(seq 50); do curl -fs http://127.0.0.1:{CLOSED_PORT}/ && "
             f"curl -fs http://127.0.0.1:{OPEN_PORT}/ && exit 0; sleep 0.1; done; exit 1"])
    a = Agent(bed, "alice", start_detached(bed, "dnbp", "dnw"), f"{bed.users['alice'].home}/dnw")
    try:
        yield a
    finally:
        lev(bed, "alice", "stop", a.id, check=False)
        for pid in pids:
            bed.run(["kill", pid], check=False)
        bed.write_file("/etc/leviath/config.toml", old)
        bed.run(["systemctl", "restart", "leviathd"])


def test_lev_ps_shows_the_proxy_as_the_default_network(testbed: Testbed, agent: Agent) -> None:
    out = lev(testbed, "alice", "ps").stdout
    assert f"{agent.id}" in out and "net:proxy" in out, out


def test_the_hosts_loopback_services_are_out_of_reach_by_default(agent: Agent) -> None:
    """The attack: read a service on the host's loopback (a database, a
    dev server, a metadata shim). Directly there is only the agent's own lo."""
    for port in (CLOSED_PORT, OPEN_PORT):
        rc, out, _err = agent.call(curl(f"http://127.0.0.1:{port}/", "--noproxy '*'"))
        assert rc != 0 and "closed host service" not in out and "dev server" not in out


def test_a_port_not_opened_is_refused_by_the_proxy_naming_the_setting(agent: Agent) -> None:
    for host in ("localhost", "127.0.0.1", "host.leviath.internal"):
        rc, out, err = agent.call(curl(f"http://{host}:{CLOSED_PORT}/", "--noproxy ''",
                                       "-x http://127.0.0.1:3128"))
        assert "closed host service" not in out, out
        assert f"[proxy] host_ports = [{CLOSED_PORT}]" in out, (rc, out, err)


def test_a_host_port_the_machine_opens_is_reached_through_the_proxy(agent: Agent) -> None:
    rc, out, err = agent.call(curl(f"http://host.leviath.internal:{OPEN_PORT}/"))
    assert rc == 0 and out == "dev server\n", err
    rc, out, err = agent.call(curl(f"http://localhost:{OPEN_PORT}/", "--noproxy ''"))
    assert rc == 0 and out == "dev server\n", err
    # CONNECT (what an https client or `lev connect` does) too.
    rc, out, err = agent.call(f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | lev connect localhost "
                              f"{OPEN_PORT}")
    assert rc == 0 and out.endswith("dev server\n"), err
