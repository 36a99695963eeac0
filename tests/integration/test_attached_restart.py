"""An attached `lev run` outlives a daemon restart and hears its agent's end
from the new daemon (Watch, on the bus's NameOwnerChanged), not by asking
every few seconds: the tests set lev's fallback poll to an hour, so a lev
that only polled would still be waiting when the test gives up. Seen failing
with lev's match on the daemon's name left out (both waited past 60 s).

From the attacker's side: carol may not watch alice's agent, and a
NameOwnerChanged forged by carol (unicast, naming her own connection as the
new daemon) followed by a forged AgentEnded does not end alice's lev."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from forged_signals import agent_ended, forge, running_agent
from testbed import Testbed

pytestmark = pytest.mark.testbed

NO_POLL = "LEVIATH_POLL_SECONDS=3600"


def _new_owner(old: str, new: str) -> list[object]:
    return ["/org/freedesktop/DBus", "org.freedesktop.DBus", "NameOwnerChanged", "sss",
            ["org.leviath.Manager1", old, new]]


@pytest.fixture()
def bed(testbed: Testbed) -> Testbed:
    testbed.start_service("leviathd.service")
    testbed.run(["mkdir", "-p", "restartw"], user="alice")
    return testbed


def _attached(bed: Testbed, flag: str, tty: bool) -> subprocess.Popen[str]:
    script = f"while [ ! -f {flag} ]; do sleep 0.1; done; echo REAL-END; exit 7"
    inner = ["env", NO_POLL, "lev", "run", "--", "sh", "-c", script]
    if tty:  # lev's asyncio client: the one that also asks about held tool calls
        quoted = " ".join(f"'{a}'" for a in inner)
        inner = ["script", "-qec", quoted, "/dev/null"]
    home = bed.users["alice"].home
    return subprocess.Popen(
        bed.command(inner, user="alice", cwd=f"{home}/restartw"),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.mark.parametrize("tty", [False, True], ids=["plain", "tty"])
def test_an_attached_run_hears_its_end_from_the_restarted_daemon(bed: Testbed, tty: bool) -> None:
    flag = f"{bed.users['alice'].home}/restartw/done-{int(tty)}"
    bed.run(["rm", "-f", flag])
    proc = _attached(bed, flag, tty)
    try:
        agent_id = running_agent(bed, "alice", f"done-{int(tty)}", proc)
        bed.run(["systemctl", "restart", "leviathd"])
        # The agent is found again by the new daemon before it ends.
        rows = json.loads(bed.run(["lev", "ps", "--json"], user="alice").stdout)
        assert any(r["id"] == agent_id for r in rows), rows
        bed.run(["touch", flag], user="alice")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 7, (proc.returncode, out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        bed.run(["rm", "-f", flag])


def test_carol_cannot_watch_alices_agent_nor_forge_a_new_daemon(bed: Testbed) -> None:
    flag = f"{bed.users['alice'].home}/restartw/forged"
    bed.run(["rm", "-f", flag])
    proc = _attached(bed, flag, False)
    try:
        agent_id = running_agent(bed, "alice", "forged", proc)
        r = bed.run(["busctl", "call", "org.leviath.Manager1", "/org/leviath/Manager1",
                     "org.leviath.Manager1", "Watch", "s", agent_id], user="carol", check=False)
        assert r.returncode != 0 and "no agent with id" in r.stderr, (r.stdout, r.stderr)
        # The forgeries do reach alice's lev: the old daemon leaving, carol
        # taking its place, then carol's word of the end.
        signals = [_new_owner("$ME", ""), _new_owner("", "$ME"), agent_ended(agent_id)]
        assert forge(bed, "carol", "alice", signals) > 0
        time.sleep(2)
        assert proc.poll() is None, "lev run believed carol's new daemon"
        bed.run(["touch", flag], user="alice")
        out, err = proc.communicate(timeout=60)
        assert "REAL-END" in out and proc.returncode == 7, (proc.returncode, out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        bed.run(["rm", "-f", flag])
