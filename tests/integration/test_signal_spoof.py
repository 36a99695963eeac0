"""Issue 20 §4: a signal is believed only from the daemon itself. The system
bus lets any user send a signal straight to another connection (unicast),
naming any path and interface; only the sender is stamped by the bus. Carol
(no group) sends alice's attached `lev run` a fake AgentEnded with status 0:
it must keep waiting, and return the agent's real status when it really ends."""

from __future__ import annotations

import subprocess
import time

from forged_signals import VENV_PY, agent_ended, agent_hook_changes, forge, running_agent
from testbed import Testbed


def test_a_spoofed_unicast_agent_ended_does_not_end_lev_run(testbed: Testbed) -> None:
    bed = testbed
    bed.start_service("leviathd.service")
    home = bed.users["alice"].home
    work = f"{home}/spoofw"
    flag = f"{work}/spoof-done"
    bed.run(["mkdir", "-p", work], user="alice")
    bed.run(["rm", "-f", flag])
    script = f"while [ ! -f {flag} ]; do sleep 0.1; done; echo REAL-END; exit 7"
    proc = subprocess.Popen(
        bed.command(["lev", "run", "--", "sh", "-c", script], user="alice", cwd=work),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        agent_id = running_agent(bed, "alice", "spoof-done", proc)
        # The signal does reach alice's lev; so does a forged list of
        # changed hook files (issue 47: told by signal, not asked for).
        forged = f"{home}/FORGED-hook"
        assert forge(bed, "carol", "alice", [agent_hook_changes(agent_id, [forged]),
                                            agent_ended(agent_id)]) > 0
        time.sleep(2)
        assert proc.poll() is None, "lev run believed carol's AgentEnded"
        bed.run(["touch", flag], user="alice")
        out, err = proc.communicate(timeout=30)
        assert "REAL-END" in out, (out, err)
        assert proc.returncode == 7, (proc.returncode, out, err)
        assert "FORGED-hook" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        bed.run(["rm", "-f", flag])


JOB_SPOOF = r"""
import asyncio
from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus

MANAGER = "org.freedesktop.systemd1.Manager"

async def main() -> None:
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    def driver(member, sig, body):
        return bus.call(Message(destination="org.freedesktop.DBus", path="/org/freedesktop/DBus",
                                interface="org.freedesktop.DBus", member=member,
                                signature=sig, body=body))
    daemon = (await driver("GetNameOwner", "s", ["org.leviath.Manager1"])).body[0]
    await driver("AddMatch", "s", [f"type='signal',sender='org.freedesktop.systemd1',"
                                   f"interface='{MANAGER}',member='JobNew'"])
    sent = 0
    def on(msg: Message) -> bool:
        nonlocal sent
        if msg.message_type is MessageType.SIGNAL and msg.member == "JobNew":
            job_id, path, unit = msg.body
            base = path.rsplit("/", 1)[0]
            # This job and the next ones: "failed", before systemd says anything.
            for n in range(job_id, job_id + 40):
                bus.send(Message(message_type=MessageType.SIGNAL, destination=daemon,
                                 path="/org/freedesktop/systemd1", interface=MANAGER,
                                 member="JobRemoved", signature="uoss",
                                 body=[n, f"{base}/{n}", unit, "failed"]))
                sent += 1
        return False
    bus.add_message_handler(on)
    print("ready", flush=True)
    await asyncio.sleep(25)

asyncio.run(main())
"""


def test_spoofed_job_results_do_not_stop_agents_from_starting(testbed: Testbed) -> None:
    """The daemon is a client of systemd's signals too: carol answers every
    job she sees with a unicast JobRemoved "failed" (for it and the next
    ones) sent to leviathd; alice's agents must still start."""
    bed = testbed
    bed.start_service("leviathd.service")
    work = f"{bed.users['alice'].home}/spoofw"
    bed.run(["mkdir", "-p", work], user="alice")
    bed.write_file("/tmp/jobspoof.py", JOB_SPOOF)
    carol = subprocess.Popen(bed.command([VENV_PY, "/tmp/jobspoof.py"], user="carol"),
                             stdout=subprocess.PIPE, text=True)
    try:
        assert carol.stdout is not None and carol.stdout.readline().strip() == "ready"
        for n in range(3):
            r = bed.run(["lev", "run", "--", "sh", "-c", f"echo started-{n}"], user="alice",
                        cwd=work, check=False)
            assert r.returncode == 0 and f"started-{n}" in r.stdout, r
    finally:
        carol.kill()
        carol.wait()
