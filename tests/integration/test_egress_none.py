"""Issue 30 item 4 for a `kind = "none"` agent (no fence, the host's
network, the user's own processes in the agent's scope): its git reaches
the hosts its git credential covers through the daemon's loopback port, as
a `network = true` agent's does (test_egress_direct.py, whose tests are run
here again against a kind none agent), and it holds only a placeholder.

The servers are test_egress_credentials.py's; the secrets are in the
machine config (root's files), the one kind of secret such an agent cannot
read for itself. From the attacker's side: inside the agent, `git credential
fill` and `lev tool git_fetch` give only the placeholder, and no secret is in
its environment, the files it reads or /proc while it clones (on the code
before this change the helper printed the token: seen failing); the
placeholder sent past the port to git.test or to another host is refused
there; bob, and alice's own processes outside the agent's scope, get nothing
sent through the port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import test_egress_direct as direct
from loop_agent import lay_out, start_detached
from test_egress_credentials import BLUEPRINT, GIT_TOKEN, answering, servers
from test_gate_bed import Agent, lev
from testbed import Testbed

pytestmark = pytest.mark.testbed

# test_egress_direct's attacks, collected here (in this order: the clone
# makes the folder the later ones use) with this module's kind none `agent`.
test_git_credential_fill_and_the_tool_give_only_a_placeholder = (
    direct.test_git_credential_fill_and_the_tool_give_only_a_placeholder)
test_clone_works_and_no_secret_is_anywhere_the_agent_can_read = (
    direct.test_clone_works_and_no_secret_is_anywhere_the_agent_can_read)
test_a_push_waits_for_a_person_and_then_lands = direct.test_a_push_waits_for_a_person_and_then_lands
test_the_placeholder_is_worthless_anywhere_else = (
    direct.test_the_placeholder_is_worthless_anywhere_else)
test_the_port_serves_no_other_host = direct.test_the_port_serves_no_other_host
test_no_one_else_gets_the_secret_sent_through_the_agents_port = (
    direct.test_no_one_else_gets_the_secret_sent_through_the_agents_port)

CONFIG = """
[sandbox]
kind = "none"
""" + direct.CREDENTIALS


class HostAgent(Agent):
    """Kind none has the host's name, not leviath-ID: the loop's folder is
    named for it."""

    host = ""

    @property
    def dir(self) -> str:
        return f"{self.workdir}/.req/{self.host}"


@pytest.fixture(scope="module")
def agent(testbed: Testbed) -> Iterator[Agent]:
    bed = testbed
    lay_out(bed, "egnw", "egnbp", BLUEPRINT)
    with servers(bed, CONFIG):
        a = HostAgent(bed, "alice", start_detached(bed, "egnbp", "egnw"),
                      f"{bed.users['alice'].home}/egnw")
        a.host = bed.run(["hostname"]).stdout.strip()
        with answering(bed, a):
            yield a


def test_the_agent_is_unfenced_and_its_git_trusts_the_agents_bundle(testbed: Testbed,
                                                                  agent: Agent) -> None:
    """What the rest is about: a kind none agent, its processes in the
    host's network namespace, its git given the agent's folder's files."""
    rc, out, err = agent.call("readlink /proc/self/ns/net; "
                              "echo $GIT_SSL_CAINFO; git config --get include.path")
    assert rc == 0, err
    own, bundle, include = out.splitlines()
    assert own == testbed.run("readlink /proc/self/ns/net").stdout.strip(), out
    assert bundle.endswith(f"/agents/{agent.id}/ca-bundle.pem"), out
    assert include.endswith(f"/agents/{agent.id}/egress.gitconfig"), out


def test_lev_inspect_says_what_kind_none_cannot_promise(testbed: Testbed, agent: Agent
                                                         ) -> None:
    out = lev(testbed, "alice", "inspect", agent.id).stdout
    flat = " ".join(out.split())
    assert "credential gitsrv (kind git): injected at the proxy toward git.test" in flat, out
    assert "kind none: git reaches these hosts through a loopback port" in flat, out
    assert "credential api (kind http): not injected at the egress (kind none" in flat, out
    assert "kind none cannot promise" in flat and "ptrace" in flat, out
    assert GIT_TOKEN not in out


# Last: it restarts the daemon (a new port, the file rewritten, the broker's
# placeholders preset before it serves).
test_after_a_daemon_restart_git_goes_through_a_new_port_with_the_placeholder = (
    direct.test_after_a_daemon_restart_git_goes_through_a_new_port_with_the_placeholder)
