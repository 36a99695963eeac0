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
from testbed import Testbed

pytestmark = pytest.mark.testbed

VENV_PY = "/opt/leviath-dev/venv/bin/python"
NO_POLL = "LEVIATH_POLL_SECONDS=3600"

FORGE = r"""
import asyncio, sys
from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus

async def main(uid: int, agent_id: str) -> None:
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    def call(member, sig="", body=()):
        return bus.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                                interface="org.freedesktop.DBus", member=member,
                                signature=sig, body=list(body)))
    (names,) = (await call("ListNames")).body
    hit = 0
    for name in names:
        if not name.startswith(":"):
            continue
        r = await call("GetConnectionUnixUser", "s", [name])
        if r.message_type is MessageType.ERROR or r.body[0] != uid:
            continue
        for old, new in ((bus.unique_name, ""), ("", bus.unique_name)):
            await bus.send(Message(
                message_type=MessageType.SIGNAL, destination=name,
                path="/org/freedesktop/DBus", interface="org.freedesktop.DBus",
                member="NameOwnerChanged", signature="sss",
                body=["org.leviath.Manager1", old, new]))
        await bus.send(Message(
            message_type=MessageType.SIGNAL, destination=name, path="/org/leviath/Manager1",
            interface="org.leviath.Manager1", member="AgentEnded", signature="sis",
            body=[agent_id, 0, "exited"]))
        hit += 1
    await asyncio.sleep(0.5)
    print(f"sent {hit}")

asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
"""


@pytest.fixture()
def bed(testbed: Testbed) -> Testbed:
    testbed.start_service("leviathd.service")
    testbed.run(["mkdir", "-p", "restartw"], user="alice")
    return testbed


def _running_agent(bed: Testbed, marker: str, proc: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"lev run ended early: {proc.communicate()}")
        rows = json.loads(bed.run(["lev", "ps", "--json"], user="alice").stdout)
        for row in rows:
            if marker in " ".join(row["command"]):
                return str(row["id"])
        time.sleep(0.2)
    raise AssertionError(f"no running agent of alice with {marker}")


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
        agent_id = _running_agent(bed, f"done-{int(tty)}", proc)
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
    bed.write_file("/tmp/forge.py", FORGE)
    proc = _attached(bed, flag, False)
    try:
        agent_id = _running_agent(bed, "forged", proc)
        r = bed.run(["busctl", "call", "org.leviath.Manager1", "/org/leviath/Manager1",
                     "org.leviath.Manager1", "Watch", "s", agent_id], user="carol", check=False)
        assert r.returncode != 0 and "no agent with id" in r.stderr, (r.stdout, r.stderr)
        r = bed.run([VENV_PY, "/tmp/forge.py", str(bed.users["alice"].uid), agent_id],
                    user="carol")
        assert r.stdout.split()[-1] != "0", r.stdout  # the forgeries did reach alice's lev
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
