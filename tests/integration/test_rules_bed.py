"""Issue 15 §1: machine policy rules decide calls made from inside a real
agent (namespace fence, its broker socket): a rule denies `read_file` of a
`*.pem` target, and another asks before `http_get` when the agent's taint is
private, though the clearance alone would let it through. Both ran through
unruled against the gate before the rules were wired in.

The agent loop and helpers are test_gate_bed.py's."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from test_gate_bed import LOOP, Agent, audit, lev, pending
from testbed import Testbed

pytestmark = pytest.mark.testbed

PORT = 18437

BLUEPRINT = """
[agent]
name = "ruled"
command = ["sh", "loop.sh"]

[read_paths]
allow = ["~/rshared"]
"""

CONFIG = """
[sandbox]
kind = "namespace"

[agent_read_paths.ruled]
allow = ["~/rshared"]

[taint]
enabled = true
on_exceed = "deny"
approval_timeout = 20
allow_private_addresses = true

[taint.clearance]
http_get = "private"

[[rules]]
name = "no-pem"
when = 'call.tool == "read_file" && call.target.endsWith(".pem")'
decision = "deny"
reason = "key files stay on the host"

[[rules]]
name = "broken"
when = 'call.tool == "list_dir" && call.args.depth > 1'
decision = "allow"

[[rules]]
name = "private-get"
when = 'call.tool == "http_get" && taint == "private"'
decision = "ask"
reason = "a private agent fetching from the web"
"""

SERVER = f"""
import http.server

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open("/root/rhits.log", "a") as f:
            f.write(self.path + "\\n")
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", {PORT}), H).serve_forever()
"""


def hits(bed: Testbed) -> list[str]:
    return bed.run(["cat", "/root/rhits.log"], check=False).stdout.splitlines()


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    h = bed.users["alice"].home
    bed.run(f"""
        set -e
        mkdir -p {h}/rw/.req {h}/rbp {h}/rshared
        cat > {h}/rbp/blueprint.toml
        printf 'granted text\\n' > {h}/rshared/doc.txt
        printf -- '-----BEGIN PRIVATE KEY-----\\nRULEKEY\\n' > {h}/rw/server.pem
        printf 'small\\n' > {h}/rw/small.txt
    """, user="alice", input=BLUEPRINT)
    bed.run(["sh", "-c", "cat > loop.sh"], user="alice", cwd=f"{h}/rw", input=LOOP)
    old_config = bed.run(["cat", "/etc/leviath/config.toml"], check=False).stdout
    bed.write_file("/etc/leviath/config.toml", CONFIG)
    bed.write_file("/root/rsrv.py", SERVER)
    bed.run(["rm", "-f", "/root/rhits.log"])
    server = subprocess.Popen(bed.command(["python3", "/root/rsrv.py"]))
    bed.run(["systemctl", "restart", "leviathd"])
    yield bed
    server.kill()
    server.wait()
    bed.write_file("/etc/leviath/config.toml", old_config)
    bed.run(["systemctl", "restart", "leviathd"])


@pytest.fixture
def agent(bed: Testbed) -> Iterator[Agent]:
    home = bed.users["alice"].home
    out = lev(bed, "alice", "run", "--detach", f"{home}/rbp", cwd=f"{home}/rw").stdout.strip()
    a = Agent(bed, "alice", out, f"{home}/rw")
    yield a
    lev(bed, "alice", "stop", a.id, check=False)


def test_a_machine_rule_denies_reading_a_pem_file_in_the_workdir(
    bed: Testbed, agent: Agent
) -> None:
    rc, out, err = agent.call("lev tool read_file server.pem")
    assert rc != 0 and "RULEKEY" not in out + err
    assert "rule:machine:no-pem" in err and "key files stay on the host" in err
    rc, out, err = agent.call("lev tool read_file small.txt")
    assert rc == 0 and out == "small\n", err
    records = [r for r in audit(bed, agent.id) if r.get("LEVIATH_TOOL") == "read_file"]
    assert [(r["LEVIATH_OUTCOME"], r["LEVIATH_RULE"]) for r in records] == [
        ("deny", "rule:machine:no-pem"), ("allow", "not-outbound")]
    assert "key files stay on the host" in records[0]["LEVIATH_DETAIL"]


def test_a_rule_that_fails_at_run_time_denies_with_the_error_in_the_audit(
    bed: Testbed, agent: Agent
) -> None:
    # `list_dir` has no `depth` argument: the rule cannot be evaluated.
    rc, out, err = agent.call("lev tool list_dir .")
    assert rc != 0 and "small.txt" not in out, err
    assert "rule:machine:broken" in err and "no such key 'depth'" in err
    records = [r for r in audit(bed, agent.id) if r.get("LEVIATH_TOOL") == "list_dir"]
    assert [(r["LEVIATH_OUTCOME"], r["LEVIATH_RULE"]) for r in records] == [
        ("deny", "rule:machine:broken")]
    assert "rule failed" in records[0]["LEVIATH_DETAIL"]


def test_a_machine_rule_asks_before_http_get_when_taint_is_private(
    bed: Testbed, agent: Agent
) -> None:
    url = f"http://127.0.0.1:{PORT}"
    rc, out, err = agent.call(f"lev tool http_get {url}/public")
    assert rc == 0 and "hello" in out, err
    home = bed.users["alice"].home
    rc, _out, err = agent.call(f"lev tool read_file {home}/rshared/doc.txt")
    assert rc == 0, err
    assert agent.taint() == "private"
    n = agent.submit(f"lev tool http_get {url}/held")
    row = pending(bed, "alice", agent.id)
    assert row["rule"] == "rule:machine:private-get", row
    lev(bed, "alice", "approve", row["id"], "--deny")
    rc, _out, err = agent.result(n)
    assert rc != 0 and "/held" not in hits(bed)
    n = agent.submit(f"lev tool http_get {url}/approved")
    row = pending(bed, "alice", agent.id)
    lev(bed, "alice", "approve", row["id"], "--once")
    rc, out, err = agent.result(n)
    assert rc == 0 and "hello" in out, err
    gets = [r for r in audit(bed, agent.id) if r.get("LEVIATH_TOOL") == "http_get"]
    assert [r["LEVIATH_OUTCOME"] for r in gets] == ["allow", "ask", "deny", "ask", "allow"]
    assert {r["LEVIATH_RULE"] for r in gets[1:]} >= {"rule:machine:private-get"}
