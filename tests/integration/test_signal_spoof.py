"""Issue 20 §4: a signal is believed only from the daemon itself. The system
bus lets any user send a signal straight to another connection (unicast),
naming any path and interface; only the sender is stamped by the bus. Carol
(no group) sends alice's attached `lev run` a fake AgentEnded with status 0:
it must keep waiting, and return the agent's real status when it really ends."""

from __future__ import annotations

import json
import subprocess
import time

from testbed import Testbed

VENV_PY = "/opt/leviath-dev/venv/bin/python"

SPOOF = r"""
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
        await bus.send(Message(
            message_type=MessageType.SIGNAL, destination=name, path="/org/leviath/Manager1",
            interface="org.leviath.Manager1", member="AgentEnded", signature="sis",
            body=[agent_id, 0, "exited"]))
        hit += 1
    await asyncio.sleep(0.5)
    print(f"sent {hit}")

asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
"""


def _running_agent(
    bed: Testbed, user: str, marker: str, proc: subprocess.Popen[str], timeout: float = 20
) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"lev run ended early: {proc.communicate()}")
        rows = json.loads(bed.run(["lev", "ps", "--json"], user=user).stdout)
        for row in rows:
            if marker in " ".join(row["command"]):
                return str(row["id"])
        time.sleep(0.2)
    raise AssertionError(f"no running agent of {user} with {marker}")


def test_a_spoofed_unicast_agent_ended_does_not_end_lev_run(testbed: Testbed) -> None:
    bed = testbed
    bed.start_service("leviathd.service")
    home = bed.users["alice"].home
    work = f"{home}/spoofw"
    flag = f"{work}/spoof-done"
    bed.run(["mkdir", "-p", work], user="alice")
    bed.run(["rm", "-f", flag])
    bed.write_file("/tmp/spoof.py", SPOOF)
    script = f"while [ ! -f {flag} ]; do sleep 0.1; done; echo REAL-END; exit 7"
    proc = subprocess.Popen(
        bed.command(["lev", "run", "--", "sh", "-c", script], user="alice", cwd=work),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        agent_id = _running_agent(bed, "alice", "spoof-done", proc)
        r = bed.run([VENV_PY, "/tmp/spoof.py", str(bed.users["alice"].uid), agent_id],
                    user="carol")
        assert r.stdout.split()[-1] != "0", r.stdout  # the signal did reach alice's lev
        time.sleep(2)
        assert proc.poll() is None, "lev run believed carol's AgentEnded"
        bed.run(["touch", flag], user="alice")
        out, err = proc.communicate(timeout=30)
        assert "REAL-END" in out, (out, err)
        assert proc.returncode == 7, (proc.returncode, out, err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        bed.run(["rm", "-f", flag])
