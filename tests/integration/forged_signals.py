"""What the signal-forging tests share: a script another user runs to unicast
look-alike signals to every bus connection of a victim's uid, and the wait
for the victim's attached agent to be running."""

from __future__ import annotations

import json
import subprocess
import time

from testbed import Testbed

VENV_PY = "/opt/leviath-dev/venv/bin/python"
SCRIPT = "/tmp/forge_signals.py"

# argv: UID, then JSON [[path, interface, member, signature, body], ...]; the
# string "$ME" in a body stands for the forger's own unique name. Prints
# "sent N", N the connections of UID reached.
FORGE = r"""
import asyncio, json, sys
from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus

async def main(uid: int, signals: list) -> None:
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
        for path, iface, member, sig, body in signals:
            body = [bus.unique_name if v == "$ME" else v for v in body]
            await bus.send(Message(message_type=MessageType.SIGNAL, destination=name, path=path,
                                   interface=iface, member=member, signature=sig, body=body))
        hit += 1
    await asyncio.sleep(0.5)
    print(f"sent {hit}")

asyncio.run(main(int(sys.argv[1]), json.loads(sys.argv[2])))
"""


def agent_ended(agent_id: str, status: int = 0) -> list[object]:
    return ["/org/leviath/Manager1", "org.leviath.Manager1", "AgentEnded", "sis",
            [agent_id, status, "exited"]]


def agent_hook_changes(agent_id: str, files: list[str]) -> list[object]:
    return ["/org/leviath/Manager1", "org.leviath.Manager1", "AgentHookChanges", "sas",
            [agent_id, files]]


def forge(bed: Testbed, forger: str, victim: str, signals: list[list[object]]) -> int:
    """`forger` sends `signals` to each connection of `victim`: how many
    connections were reached."""
    bed.write_file(SCRIPT, FORGE)
    r = bed.run([VENV_PY, SCRIPT, str(bed.users[victim].uid), json.dumps(signals)], user=forger)
    return int(r.stdout.split()[-1])


def running_agent(
    bed: Testbed, user: str, marker: str, proc: subprocess.Popen[str], timeout: float = 30
) -> str:
    """The id of `user`'s running agent whose command mentions `marker`,
    started by `proc` (an attached `lev run`, which must not end first)."""
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
