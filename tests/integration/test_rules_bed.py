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
from journal_wait import config_read_since, config_written, journal_with
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
# The host's network, chosen: the build stage's shell reaches a server on the
# bed's loopback (the default is the proxy since issue 30).
network = true

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
name = "no-read-in-build"
when = 'agent.stage == "build" && call.tool == "read_file"'
decision = "deny"
reason = "the build stage reads nothing"

[[rules]]
name = "private-get"
when = 'call.tool == "http_get" && taint == "private"'
decision = "ask"
reason = "a private agent fetching from the web"
"""

STAGED = """
[agent]
name = "staged"

[stages.plan]
command = ["sh", "step.sh", "plan"]

[stages.plan.sandbox]
network = false

[stages.build]
command = ["sh", "step.sh", "build"]
"""

# Each stage reads a file and, through the shell tool, tries the bed's
# loopback server (reachable only with the network the build stage has).
STEP = f"""
lev tool read_file small.txt > $1.out 2>&1; echo rc=$? >> $1.out
lev tool shell "python3 -c 'import socket; \\
socket.create_connection((\\"127.0.0.1\\", {PORT}), 3); print(\\"REACHED\\")'" > $1.net 2>&1
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
        mkdir -p {h}/rw/.req {h}/rbp {h}/rshared {h}/rstaged {h}/rsw
        printf 'small\\n' > {h}/rsw/small.txt
        cat > {h}/rbp/blueprint.toml
        printf 'granted text\\n' > {h}/rshared/doc.txt
        printf -- '-----BEGIN PRIVATE KEY-----\\nRULEKEY\\n' > {h}/rw/server.pem
        printf 'small\\n' > {h}/rw/small.txt
    """, user="alice", input=BLUEPRINT)
    bed.run(["sh", "-c", "cat > loop.sh"], user="alice", cwd=f"{h}/rw", input=LOOP)
    bed.run(["sh", "-c", "cat > blueprint.toml"], user="alice", cwd=f"{h}/rstaged",
            input=STAGED)
    bed.run(["sh", "-c", "cat > step.sh"], user="alice", cwd=f"{h}/rsw", input=STEP)
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


def test_a_rule_sees_the_stage_the_agent_runs(bed: Testbed) -> None:
    """`agent.stage` is the running [stages.NAME] (it was always "" before,
    so a stage rule never matched: seen failing), and the shell tool runs in
    that stage's fence (before, always in the last stage's: the plan stage's
    shell had the build stage's network; seen failing)."""
    home = bed.users["alice"].home
    lev(bed, "alice", "run", f"{home}/rstaged", cwd=f"{home}/rsw", check=False)
    plan = bed.read_file(f"{home}/rsw/plan.out")
    build = bed.read_file(f"{home}/rsw/build.out")
    assert "small" in plan and "rc=0" in plan, plan
    assert "rule:machine:no-read-in-build" in build and "rc=0" not in build, build
    assert "REACHED" in bed.read_file(f"{home}/rsw/build.net")
    # The plan stage's refusal in its own words (its own lo, where nothing
    # listens), not any failure of the shell tool or of python.
    net = bed.read_file(f"{home}/rsw/plan.net")
    assert "REACHED" not in net and "ConnectionRefusedError" in net, net


RULES_D = "/etc/leviath/rules.d"
NO_SMALL = """
[[rules]]
name = "no-small"
when = 'call.tool == "read_file" && call.target.endsWith("/small.txt")'
decision = "deny"
reason = "rules.d says no"
"""
LET_OUT = """
[[rules]]
name = "let-it-out"
when = 'call.tool == "http_get"'
decision = "allow"
"""


def _clear_rules_d(bed: Testbed) -> None:
    # The daemon watches rules.d (`systemctl reload` would fail on a refused
    # set): when files went, its record of the new read is waited for.
    had = bed.run(f"ls {RULES_D}/*.toml", check=False).stdout.strip()
    since = bed.run(["date", "+@%s.%N"]).stdout.strip()
    bed.run(f"rm -f {RULES_D}/*.toml; chown root:root {RULES_D}; chmod 755 {RULES_D}",
            check=False)
    if had:
        config_read_since(bed, since)


def test_a_rule_in_rules_d_decides_and_a_users_file_there_is_refused(bed: Testbed) -> None:
    """Machine rules from /etc/leviath/rules.d are in force; a file there that
    is not root's alone (a user's, or group-writable) is refused with the whole
    set, so the configuration in force stays the last good one (seen failing
    with the ownership check removed: alice's allow rule let a private agent's
    http_get through)."""
    home = bed.users["alice"].home
    url = f"http://127.0.0.1:{PORT}"
    try:
        config_written(bed, f"{RULES_D}/10-small.toml", NO_SMALL)
        a = Agent(bed, "alice", lev(bed, "alice", "run", "--detach", f"{home}/rbp",
                                    cwd=f"{home}/rw").stdout.strip(), f"{home}/rw")
        try:
            rc, _out, err = a.call("lev tool read_file small.txt")
            assert rc != 0 and "rule:machine:no-small" in err and "rules.d says no" in err
        finally:
            lev(bed, "alice", "stop", a.id, check=False)
        # alice's file (an admin's slip: chown, or a group-writable folder).
        # Made alice's before it takes its name (the watch sees one file,
        # already hers), and the daemon's refusal of the set waited for.
        since = bed.run(["date", "+@%s.%N"]).stdout.strip()
        bed.write_file(f"{RULES_D}/20-alice.new", LET_OUT)
        bed.run(["chown", "alice", f"{RULES_D}/20-alice.new"])
        bed.run(["mv", f"{RULES_D}/20-alice.new", f"{RULES_D}/20-alice.toml"])
        config_read_since(bed, since, loads=False)
        r = bed.run(["systemctl", "reload", "leviathd"], check=False)
        assert r.returncode != 0
        assert "not root" in journal_with(bed, ["-u", "leviathd", "-n", "50"], "not root")
        bed.run(["rm", "-f", "/root/rhits.log"])
        a = Agent(bed, "alice", lev(bed, "alice", "run", "--detach", f"{home}/rbp",
                                    cwd=f"{home}/rw").stdout.strip(), f"{home}/rw")
        try:
            rc, _out, err = a.call(f"lev tool read_file {home}/rshared/doc.txt")
            assert rc == 0 and a.taint() == "private", err
            n = a.submit(f"lev tool http_get {url}/leaked")
            row = pending(bed, "alice", a.id)
            assert row["rule"] == "rule:machine:private-get", row
            lev(bed, "alice", "approve", row["id"], "--deny")
            assert a.result(n)[0] != 0 and "/leaked" not in hits(bed)
            # The last good set is still in force: no-small still decides.
            rc, _out, err = a.call("lev tool read_file small.txt")
            assert rc != 0 and "rule:machine:no-small" in err
        finally:
            lev(bed, "alice", "stop", a.id, check=False)
    finally:
        _clear_rules_d(bed)
        bed.run(["systemctl", "restart", "leviathd"])


def test_lev_policy_add_rule_system_needs_config_manage_and_goes_to_rules_d(
    bed: Testbed,
) -> None:
    home = bed.users["alice"].home
    args = ["policy", "add", "--rule", "no-small-sys", "--when",
            'call.tool == "read_file" && call.target.endsWith("/small.txt")',
            "--decision", "deny", "--reason", "added by dave", "--system"]
    try:
        r = lev(bed, "alice", *args, check=False)
        assert r.returncode != 0 and "org.leviath.config.manage" in r.stderr, r
        assert bed.run(["ls", RULES_D]).stdout.strip() == ""
        r = lev(bed, "dave", *args)
        assert "50-lev-policy-add.toml" in r.stdout, r
        text = bed.read_file(f"{RULES_D}/50-lev-policy-add.toml")
        assert 'name = "no-small-sys"' in text
        st = bed.run(["stat", "-c", "%u %a", f"{RULES_D}/50-lev-policy-add.toml"]).stdout
        assert st.split() == ["0", "644"]
        # The same name again is refused (names are what the audit shows).
        r = lev(bed, "dave", *args, check=False)
        assert r.returncode != 0 and "already defined" in r.stderr, r
        # A rule that does not compile is refused with its column, nothing written.
        r = lev(bed, "dave", "policy", "add", "--rule", "bad", "--when", "call.tool = 1",
                "--decision", "deny", "--system", check=False)
        assert r.returncode != 0 and "does not compile" in r.stderr, r
        assert "bad" not in bed.read_file(f"{RULES_D}/50-lev-policy-add.toml")
        a = Agent(bed, "alice", lev(bed, "alice", "run", "--detach", f"{home}/rbp",
                                    cwd=f"{home}/rw").stdout.strip(), f"{home}/rw")
        try:
            rc, _out, err = a.call("lev tool read_file small.txt")
            assert rc != 0 and "rule:machine:no-small-sys" in err and "added by dave" in err
        finally:
            lev(bed, "alice", "stop", a.id, check=False)
    finally:
        _clear_rules_d(bed)


RULE_ADD = r"""
import asyncio, sys
from dbus_fast import BusType, Message
from dbus_fast.aio import MessageBus

async def main():
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    big = "true || " * (1 << 17)
    for body in (["big", big, "deny", ""], ["nl", "true\ntrue", "deny", ""],
                 ["odd", "true", "maybe", ""], ["x" * 100, "true", "deny", ""]):
        reply = await bus.call(Message(
            destination="org.leviath.Manager1", path="/org/leviath/Manager1",
            interface="org.leviath.Policy1", member="RuleAdd", signature="ssss", body=body))
        print(reply.error_name, len(str(reply.body[0])))

asyncio.run(main())
"""


def test_rule_add_refuses_oversized_and_malformed_arguments(bed: Testbed) -> None:
    """A megabyte condition, a newline, an unknown decision and a long name
    each get InvalidArgument with a short message, and nothing is written."""
    py = "/opt/leviath-dev/venv/bin/python"
    try:
        out = bed.run([py, "-c", RULE_ADD]).stdout.split("\n")
        rows = [line.split() for line in out if line.strip()]
        assert [r[0] for r in rows] == ["org.leviath.Error.InvalidArgument"] * 4, rows
        assert all(int(r[1]) < 1000 for r in rows), rows
        assert bed.run(["ls", RULES_D]).stdout.strip() == ""
    finally:
        _clear_rules_d(bed)
