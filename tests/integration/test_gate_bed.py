"""The tool gate end to end in the test bed (issue 6): real agents in namespace
sandboxes call real tools with `lev tool` and `lev mcp` through their broker
socket, people answer with `lev approvals` / `lev approve`, and every decision
is checked where it lands (the agent's output, the journal, an HTTP server on
the bed's loopback).

The agent is a small loop (loop.sh) that runs each request script the test
drops into its workdir (.req/leviath-<id>/, by the sandbox's host name), in
the background, and leaves the exit status, stdout and stderr next to it: the
calls come from inside the agent's sandbox."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
from journal_wait import config_written
from loop_agent import LOOP, LoopAgent
from testbed import Testbed

pytestmark = pytest.mark.testbed

PORT = 18431
BLUEPRINT = """
[agent]
name = "gatetest"
description = "runs the test's tool calls"
command = ["sh", "loop.sh"]

[read_paths]
allow = ["~/shared", "~/notes", "~/later"]
"""


SERVER = f"""
import http.server

class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open("/root/posts.log", "ab") as f:
            f.write(body + b"\\n")
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"got it")

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", {PORT}), H).serve_forever()
"""


def config(extra_grants: str = "") -> str:
    return f"""
[sandbox]
kind = "namespace"

[tool_permissions]
list_dir = "ask"

[agent_tool_permissions.gatetest]
web_fetch = "deny"

[agent_read_paths.gatetest]
allow = ["~/shared"{extra_grants}]

[taint]
enabled = true
on_exceed = "ask"
budget = 4
approval_timeout = 6
allow_private_addresses = true

[[allowlist]]
tool = "http_post"
target = "localhost"
max_sensitivity = "private"

[credentials.api]
command = ["sh", "-c", "read -r API_TOKEN; echo token=$API_TOKEN args=$*", "cred"]
secret_file = "/etc/leviath/api.key"
"""


class Agent(LoopAgent):
    """The gate tests' agent, as the bed tests that import it build it:
    (bed, user, id, workdir), 30 s a call."""

    def __init__(self, bed: Testbed, user: str, agent_id: str, workdir: str) -> None:
        super().__init__(bed, agent_id, workdir, user=user, timeout=30)

    def taint(self) -> str:
        rc, out, err = self.call("lev tool --ledger")
        assert rc == 0, err
        return str(json.loads(out)["taint"])


def lev(bed: Testbed, user: str, *args: str, check: bool = True, cwd: str | None = None):
    return bed.run(["lev", *args], user=user, check=check, cwd=cwd or bed.users[user].home)


def start_agent(bed: Testbed, user: str) -> Agent:
    home = bed.users[user].home
    workdir = f"{home}/gw"
    out = lev(bed, user, "run", "--detach", f"{home}/bp", cwd=workdir).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", out), out
    return Agent(bed, user, out, workdir)


def pending(bed: Testbed, user: str, agent_id: str, timeout: float = 15) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = json.loads(lev(bed, user, "approvals", "--json").stdout)
        for row in rows:
            if row["agent"] == agent_id:
                return dict(row)
        time.sleep(0.2)
    raise AssertionError(f"no approval request of agent {agent_id} appeared for {user}")


def audit(bed: Testbed, agent_id: str,
          until: Callable[[list[dict]], bool] | None = None) -> list[dict]:
    """The agent's tool records; with `until`, once it holds of them (30 s
    at most: journald may not have the last ones yet on a loaded machine)."""
    deadline = time.monotonic() + 30
    while True:
        out = bed.run(["journalctl", "--no-pager", "-o", "json", f"LEVIATH_AGENT={agent_id}",
                       "LEVIATH_EVENT=tool"]).stdout
        records = [json.loads(line) for line in out.splitlines() if line.strip()]
        if until is None or until(records) or time.monotonic() > deadline:
            return records
        time.sleep(0.3)


def posts(bed: Testbed) -> list[str]:
    r = bed.run(["cat", "/root/posts.log"], check=False)
    return r.stdout.splitlines()


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    bed = testbed
    for user in ("alice", "bob"):
        h = bed.users[user].home
        bed.run(f"""
            set -e
            mkdir -p {h}/gw/.req {h}/bp {h}/shared {h}/notes {h}/later {h}/.ssh
            cat > {h}/bp/blueprint.toml
            printf 'granted text\\n' > {h}/shared/doc.txt
            printf 'not granted\\n' > {h}/notes/n.txt
            printf 'later text\\n' > {h}/later/l.txt
            printf 'small\\n' > {h}/gw/small.txt
            printf 'PRIVATE-KEY-{user}' > {h}/.ssh/id_ed25519
            chmod 600 {h}/.ssh/id_ed25519
            ln -sf {h}/.ssh/id_ed25519 {h}/shared/innocent.txt
        """, user=user, input=BLUEPRINT)
        bed.run(["sh", "-c", "cat > loop.sh"], user=user, cwd=f"{h}/gw", input=LOOP)
    bed.write_file("/etc/leviath/config.toml", config())
    bed.write_file("/etc/leviath/api.key", "s3cret-value\n", mode=0o600)
    bed.write_file("/root/srv.py", SERVER)
    bed.run(["rm", "-f", "/root/posts.log"])
    server = subprocess.Popen(bed.command(["python3", "/root/srv.py"]))
    bed.run(["systemctl", "restart", "leviathd"])
    yield bed
    server.kill()
    server.wait()


@pytest.fixture(scope="module")
def alice_agent(bed: Testbed) -> Iterator[Agent]:
    agent = start_agent(bed, "alice")
    yield agent
    lev(bed, "alice", "stop", agent.id, check=False)


def test_the_agent_sees_only_its_own_socket_and_reaches_its_broker(
    bed: Testbed, alice_agent: Agent
) -> None:
    rc, out, err = alice_agent.call("ls -a /run/leviath; echo \"$LEVIATH_BROKER\"; "
                                    "lev tool read_file small.txt")
    assert rc == 0, err
    # proxy.sock: the default network is the proxy (issue 30).
    assert out.split() == [".", "..", "broker.sock", "proxy.sock", "/run/leviath/broker.sock",
                           "small"]
    folder = f"/run/leviath/agents/{alice_agent.id}"
    st = bed.run(["stat", "-c", "%U %G %a", folder, f"{folder}/broker.sock"]).stdout.split()
    # Root's folder (issue 9: nothing a user can write), searchable by her group.
    assert st == ["root", "alice", "750", "alice", "alice", "600"]


def test_a_denied_tool_is_refused(alice_agent: Agent) -> None:
    rc, _out, err = alice_agent.call("lev tool web_fetch http://localhost:1/")
    assert rc != 0 and "denied" in err and "permission" in err


def test_an_unknown_tool_is_refused(alice_agent: Agent) -> None:
    rc, _out, err = alice_agent.call("lev tool frobnicate now")
    assert rc != 0 and "denied" in err and "unknown" in err


def test_an_asked_tool_waits_then_runs_after_approve_once(bed: Testbed, alice_agent: Agent) -> None:
    n = alice_agent.submit("lev tool list_dir .")
    row = pending(bed, "alice", alice_agent.id)
    assert row["tool"] == "list_dir" and row["kind"] == "permission" and row["user"] == "alice"
    time.sleep(0.5)
    assert not alice_agent.done(n)  # held
    lev(bed, "alice", "approve", row["id"], "--once")
    rc, out, err = alice_agent.result(n)
    assert rc == 0, err
    assert "small.txt" in out


def test_an_asked_tool_is_refused_after_deny(bed: Testbed, alice_agent: Agent) -> None:
    n = alice_agent.submit("lev tool list_dir .")
    row = pending(bed, "alice", alice_agent.id)
    lev(bed, "alice", "approve", row["id"], "--deny")
    rc, _out, err = alice_agent.result(n)
    assert rc != 0 and "refused-by-person-or-timeout" in err


def test_an_asked_tool_is_refused_when_nobody_answers_in_time(
    bed: Testbed, alice_agent: Agent
) -> None:
    t0 = time.monotonic()
    rc, _out, err = alice_agent.call("lev tool list_dir .")
    assert rc != 0 and "refused-by-person-or-timeout" in err
    assert time.monotonic() - t0 >= 5  # approval_timeout = 6


def test_bob_cannot_see_or_answer_alices_approvals_but_dave_can(
    bed: Testbed, alice_agent: Agent
) -> None:
    n = alice_agent.submit("lev tool list_dir .")
    row = pending(bed, "alice", alice_agent.id)
    assert json.loads(lev(bed, "bob", "approvals", "--json").stdout) == []
    r = lev(bed, "bob", "approve", row["id"], "--once", check=False)
    assert r.returncode != 0 and "no pending approval" in r.stderr
    time.sleep(0.3)
    assert not alice_agent.done(n)
    assert pending(bed, "dave", alice_agent.id)["id"] == row["id"]
    lev(bed, "dave", "approve", row["id"], "--once")
    rc, _out, err = alice_agent.result(n)
    assert rc == 0, err


def test_reads_outside_the_workdir_need_a_grant_and_raise_taint_to_private(
    bed: Testbed,
) -> None:
    agent = start_agent(bed, "alice")
    home = bed.users["alice"].home
    try:
        assert agent.taint() == "public"
        rc, _out, err = agent.call(f"lev tool read_file {home}/notes/n.txt")
        assert rc != 0 and "denied" in err and "not-granted" in err
        assert agent.taint() == "public"
        rc, out, err = agent.call(f"lev tool read_file {home}/shared/doc.txt")
        assert rc == 0 and out == "granted text\n", err
        assert agent.taint() == "private"
    finally:
        lev(bed, "alice", "stop", agent.id, check=False)


def test_a_symlink_planted_in_a_granted_folder_cannot_reach_ssh(bed: Testbed) -> None:
    agent = start_agent(bed, "alice")
    home = bed.users["alice"].home
    try:
        rc, out, err = agent.call(f"lev tool read_file {home}/shared/innocent.txt")
        assert rc != 0 and "PRIVATE-KEY" not in out + err
        assert "real-path" in err or "not granted" in err
    finally:
        lev(bed, "alice", "stop", agent.id, check=False)


def test_http_post_is_held_after_a_private_read_allowlisted_passes_and_eviction_frees_it(
    bed: Testbed,
) -> None:
    agent = start_agent(bed, "alice")
    home = bed.users["alice"].home
    try:
        rc, _out, err = agent.call(f"lev tool read_file {home}/shared/doc.txt")
        assert rc == 0, err
        # Held by the taint gate (private above http_post's internal clearance).
        n = agent.submit(f"lev tool http_post http://127.0.0.1:{PORT}/ held-body")
        row = pending(bed, "alice", agent.id)
        assert row["kind"] == "taint" and row["target"] == "127.0.0.1"
        assert row["taint"] == "private"
        lev(bed, "alice", "approve", row["id"], "--deny")
        rc, _out, err = agent.result(n)
        assert rc != 0 and "held-body" not in posts(bed)
        # The allowlist covers localhost up to private: passes without asking.
        rc, out, err = agent.call(f"lev tool http_post http://localhost:{PORT}/ allowed-body")
        assert rc == 0 and "got it" in out, err
        assert "allowed-body" in posts(bed)
        # Four workdir reads (Internal) evict the Private entries (budget 4).
        for _ in range(4):
            assert agent.call("lev tool read_file small.txt")[0] == 0
        assert agent.taint() == "internal"
        rc, out, err = agent.call(f"lev tool http_post http://127.0.0.1:{PORT}/ later-body",
                                  timeout=10)
        assert rc == 0 and "got it" in out, err
        assert "later-body" in posts(bed)
        records = audit(bed, agent.id, lambda rs: sum(
            r.get("LEVIATH_TOOL") == "http_post" for r in rs) >= 4)
        posts_seen = [r for r in records if r.get("LEVIATH_TOOL") == "http_post"]
        assert [r["LEVIATH_OUTCOME"] for r in posts_seen] == ["ask", "deny", "allow", "allow"]
        assert posts_seen[2]["LEVIATH_RULE"].startswith("allowlist")
    finally:
        lev(bed, "alice", "stop", agent.id, check=False)


def test_every_decision_is_in_the_agents_journal_with_its_fields(
    bed: Testbed, alice_agent: Agent
) -> None:
    alice_agent.call("lev tool web_fetch http://localhost:1/")
    alice_agent.call("lev tool read_file small.txt")
    deadline = time.monotonic() + 10
    while True:
        records = audit(bed, alice_agent.id)
        tools = {(r.get("LEVIATH_TOOL"), r.get("LEVIATH_OUTCOME")) for r in records}
        if {("web_fetch", "deny"), ("read_file", "allow")} <= tools:
            break
        assert time.monotonic() < deadline, tools
        time.sleep(0.3)
    for r in records:
        for key in ("AGENT", "USER", "TOOL", "TARGET", "TAINT", "CLEARANCE", "RULE", "OUTCOME"):
            assert f"LEVIATH_{key}" in r, (key, r)
        assert r["LEVIATH_AGENT"] == alice_agent.id and r["LEVIATH_USER"] == "alice"
    denied = next(r for r in records if r["LEVIATH_TOOL"] == "web_fetch")
    assert denied["LEVIATH_RULE"].startswith("permission")
    assert denied["LEVIATH_TARGET"] == "localhost"


def test_shell_runs_in_the_agents_own_scope_and_sandbox(bed: Testbed, alice_agent: Agent) -> None:
    home = bed.users["alice"].home
    rc, out, err = alice_agent.call(
        "lev tool shell 'cat /proc/self/cgroup; id -u; ls ~/.ssh; cat small.txt'"
    )
    assert rc == 0, err
    result = json.loads(out)
    assert result["exit_status"] == 0, result
    text = result["stdout"]
    unit = f"leviath-alice-gatetest-{alice_agent.id}.scope"
    assert unit in text
    assert str(bed.users["alice"].uid) in text.split()
    assert "id_ed25519" not in text  # the fence hides ~/.ssh
    assert "small" in text
    assert home  # the workdir is the same folder inside


def test_lev_mcp_inside_the_agent_lists_and_calls_the_gated_tools(alice_agent: Agent) -> None:
    msgs = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2024-11-05", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "read_file", "arguments": {"path": "small.txt"}}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
         "params": {"name": "web_fetch", "arguments": {"url": "http://localhost:1/"}}},
    ]
    script = "cat > .mcp-in <<'EOF'\n" + "\n".join(json.dumps(m) for m in msgs) + "\nEOF\n"
    rc, out, err = alice_agent.call(script + "lev mcp < .mcp-in")
    assert rc == 0, err
    replies = {r["id"]: r for r in map(json.loads, out.splitlines())}
    names = {t["name"] for t in replies[2]["result"]["tools"]}
    assert {"read_file", "list_dir", "http_post", "shell"} <= names
    assert replies[3]["result"]["isError"] is False
    assert "small" in replies[3]["result"]["content"][0]["text"]
    assert replies[4]["result"]["isError"] is True


def test_the_credential_tool_uses_a_root_only_secret_the_agent_never_sees(
    bed: Testbed, alice_agent: Agent
) -> None:
    r = bed.run(["cat", "/etc/leviath/api.key"], user="alice", check=False)
    assert r.returncode != 0  # alice herself cannot read it
    # Earlier tests' agents left Private output in gw/.req: the workdir's mark
    # (and so the shell's output) is Private; start from a clean ledger.
    rc, out, err = alice_agent.call("lev tool --ledger")
    ids = [str(e["id"]) for e in json.loads(out)["entries"] if e["label"] == "private"]
    if ids:
        assert alice_agent.call(f"lev tool --evict {' '.join(ids)}")[0] == 0
    rc, out, err = alice_agent.call("lev tool credential api one two")
    assert rc == 0, err
    result = json.loads(out)
    assert "token=[redacted] args=one two" in result["stdout"]
    assert "s3cret" not in out + err


def test_an_unsandboxed_agent_reaches_its_broker_by_the_host_path(bed: Testbed) -> None:
    home = bed.users["dave"].home
    bed.run(f"mkdir -p {home}/gw && echo dave-small > {home}/gw/small.txt", user="dave")
    r = bed.run(["lev", "run", "--no-sandbox", "--", "sh", "-c",
                 'echo "$LEVIATH_BROKER"; lev tool read_file small.txt'],
                user="dave", cwd=f"{home}/gw")
    lines = r.stdout.splitlines()
    assert re.fullmatch(r"/run/leviath/agents/[0-9a-f]{8}/broker\.sock", lines[0]), lines
    assert lines[1] == "dave-small"


def test_lev_run_on_a_terminal_asks_inline_and_the_answer_lets_the_call_run(
    bed: Testbed,
) -> None:
    home = bed.users["alice"].home
    inner = "lev run -- sh -c 'lev tool list_dir . >/dev/null && echo LISTED'"
    r = bed.run(f"(sleep 4; printf 'o\\n'; sleep 6) | script -qec \"{inner}\" /dev/null",
                user="alice", cwd=f"{home}/gw", timeout=60)
    assert "Allow [o]nce" in r.stdout and "list_dir" in r.stdout
    assert "LISTED" in r.stdout, r.stdout


def test_only_the_agent_itself_may_use_its_socket(bed: Testbed, alice_agent: Agent) -> None:
    sock = f"/run/leviath/agents/{alice_agent.id}/broker.sock"
    connect = f"import socket; socket.socket(socket.AF_UNIX).connect({sock!r})"
    # bob cannot even connect (the folder is alice's, 0700).
    r = bed.run(["python3", "-c", connect], user="bob", check=False)
    assert r.returncode != 0 and "Permission denied" in r.stderr
    # alice herself, outside her agent's scope, is refused by cgroup.
    r = bed.run(["lev", "tool", "read_file", "small.txt"], user="alice", check=False,
                env={"LEVIATH_BROKER": sock}, cwd=alice_agent.workdir)
    assert r.returncode != 0 and "is not agent" in r.stderr
    # bob's agent: alice's socket is not in its world; its own broker is its own.
    bobs = start_agent(bed, "bob")
    try:
        rc, _out, err = bobs.call(f"LEVIATH_BROKER={sock} lev tool read_file small.txt")
        assert rc != 0 and "cannot reach the broker" in err
        rc, out, err = bobs.call("lev tool read_file small.txt; lev tool --ledger")
        assert rc == 0, err
        assert json.loads(out[len("small\n"):])["entries"][0]["target"].startswith(
            bed.users["bob"].home)
    finally:
        lev(bed, "bob", "stop", bobs.id, check=False)
    records = audit(bed, alice_agent.id, lambda rs: any(
        r["LEVIATH_RULE"] == "peer-identity" and r["LEVIATH_OUTCOME"] == "deny" for r in rs))
    assert any(r["LEVIATH_RULE"] == "peer-identity" and r["LEVIATH_OUTCOME"] == "deny"
               for r in records)


def test_a_grant_added_to_the_config_applies_to_the_next_run_and_a_broken_edit_keeps_it(
    bed: Testbed, alice_agent: Agent
) -> None:
    later = f"{bed.users['alice'].home}/later/l.txt"
    assert alice_agent.call(f"lev tool read_file {later}")[0] != 0
    # Read by the watch (no restart, no reload); its record waited for.
    config_written(bed, "/etc/leviath/config.toml", config(', "~/later"'))
    agent = start_agent(bed, "alice")
    try:
        rc, out, err = agent.call(f"lev tool read_file {later}")
        assert rc == 0 and out == "later text\n", err
    finally:
        lev(bed, "alice", "stop", agent.id, check=False)
    # A running agent keeps the policy it started with.
    assert alice_agent.call(f"lev tool read_file {later}")[0] != 0
    config_written(bed, "/etc/leviath/config.toml", config(', "~/later"') + "\n[[[ broken\n",
                   loads=False)
    agent = start_agent(bed, "alice")
    try:
        rc, out, err = agent.call(f"lev tool read_file {later}")
        assert rc == 0 and out == "later text\n", err
    finally:
        lev(bed, "alice", "stop", agent.id, check=False)
    config_written(bed, "/etc/leviath/config.toml", config())


def test_lev_policy_add_system_needs_config_manage_and_applies_to_the_next_run(
    bed: Testbed,
) -> None:
    r = lev(bed, "alice", "policy", "add", "http_post", "--target", "example.org",
            "--max-sensitivity", "internal", "--system", check=False)
    assert r.returncode != 0 and "org.leviath.config.manage" in r.stderr
    assert "example.org" not in bed.read_file("/etc/leviath/config.toml")
    lev(bed, "dave", "policy", "add", "http_post", "--target", "127.0.0.1",
        "--max-sensitivity", "private", "--system")
    assert 'target = "127.0.0.1"' in bed.read_file("/etc/leviath/config.toml")
    agent = start_agent(bed, "alice")
    home = bed.users["alice"].home
    try:
        assert agent.call(f"lev tool read_file {home}/shared/doc.txt")[0] == 0
        rc, out, err = agent.call(f"lev tool http_post http://127.0.0.1:{PORT}/ sys-body",
                                  timeout=10)
        assert rc == 0 and "got it" in out, err
    finally:
        lev(bed, "alice", "stop", agent.id, check=False)
        config_written(bed, "/etc/leviath/config.toml", config())


def test_an_agent_adopted_after_a_daemon_restart_keeps_its_broker_policy_and_taint(
    bed: Testbed, alice_agent: Agent
) -> None:
    home = bed.users["alice"].home
    assert alice_agent.call(f"lev tool read_file {home}/shared/doc.txt")[0] == 0
    rc, before, err = alice_agent.call("lev tool --ledger")
    assert rc == 0 and json.loads(before)["taint"] == "private", err
    bed.run(["systemctl", "restart", "leviathd"])
    rc, after, err = alice_agent.call("lev tool --ledger")
    assert rc == 0, err
    assert json.loads(after)["entries"] == json.loads(before)["entries"]
    assert json.loads(after)["taint"] == "private"
    rc, out, err = alice_agent.call("lev tool read_file small.txt")
    assert rc == 0 and out == "small\n", err
    rc, _out, err = alice_agent.call("lev tool web_fetch http://localhost:1/")
    assert rc != 0 and "denied" in err  # the policy it started with
