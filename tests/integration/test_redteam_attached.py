"""Red team for issue 18's attached agents without a supervisor, polkit
answered beside the start, and the fence's recursive lock: attacks from a
hostile D-Bus client (alice, or carol whom polkit refuses) and from inside
an agent, each written from the attacker's side in the test bed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

pytestmark = pytest.mark.testbed

VENV_PY = "/opt/leviath-dev/venv/bin/python"
CONFIG = '[sandbox]\nkind = "namespace"\n'

# A client that calls RunAttached over the raw bus with descriptors lev
# never sends: 16 attached where 3 are named, the read end of a pipe, a
# socket, /dev/null, one pipe three times.
HOSTILE = r"""
import asyncio, os, socket, sys
from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus

async def main(mode: str, n: int, workdir: str) -> None:
    bus = await MessageBus(bus_type=BusType.SYSTEM, negotiate_unix_fd=True).connect()
    req = {"command": Variant("as", ["sh", "-c", "echo hostile-run"]),
           "workdir": Variant("s", workdir)}
    r_, w_ = os.pipe()
    a, b = socket.socketpair()
    null = os.open("/dev/null", os.O_RDWR)
    fds = {"extra": [w_] * 16, "read_end": [null, r_, r_], "socket": [null, a.fileno(), a.fileno()],
           "devnull": [null, null, null], "same": [w_, w_, w_]}[mode]
    errors, last = 0, None
    for _ in range(n):
        reply = await bus.call(Message(
            destination="org.leviath.Manager1", path="/org/leviath/Manager1",
            interface="org.leviath.Manager1", member="RunAttached", signature="a{sv}hhh",
            body=[req, 0, 1, 2], unix_fds=fds))
        if reply.message_type is MessageType.ERROR:
            errors, last = errors + 1, reply.body
    os.close(w_)
    print("errors", errors, last)
    print("pipe-read", os.read(r_, 65536).decode(errors="replace").replace("\n", " "))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    testbed.run(["systemctl", "restart", "leviathd"])
    for user in ("alice", "carol"):
        testbed.run(["mkdir", "-p", "work"], user=user)
    testbed.write_file("/tmp/hostile.py", HOSTILE)
    yield testbed


def _daemon_pid(bed: Testbed) -> str:
    return bed.run(["systemctl", "show", "-P", "MainPID", "leviathd"]).stdout.strip()


def _daemon_fds(bed: Testbed) -> int:
    return len(bed.run(["ls", f"/proc/{_daemon_pid(bed)}/fd"]).stdout.split())


def _settle_fds(bed: Testbed, before: int, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    now = _daemon_fds(bed)
    while now > before + 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        now = _daemon_fds(bed)
    return now


def _hostile(bed: Testbed, user: str, mode: str, n: int) -> str:
    work = f"{bed.users[user].home}/work"
    return bed.run([VENV_PY, "/tmp/hostile.py", mode, str(n), work], user=user,
                   check=False, timeout=300).stdout


def _agents_end(bed: Testbed, user: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = json.loads(bed.run(["lev", "ps", "--json"], user=user).stdout)
        if not rows:
            return
        time.sleep(0.3)
    raise AssertionError(f"{user}'s agents still running: {rows}")


@pytest.mark.parametrize("user", ["alice", "carol"])
def test_descriptors_beyond_the_three_named_are_not_kept_by_the_daemon(
    bed: Testbed, user: str
) -> None:
    """40 RunAttached calls each carrying 16 descriptors (3 named): the
    daemon's descriptor count comes back; carol (refused) too."""
    pid = _daemon_pid(bed)
    before = _daemon_fds(bed)
    out = _hostile(bed, user, "extra", 40)
    _agents_end(bed, user)
    after = _settle_fds(bed, before)
    assert _daemon_pid(bed) == pid
    assert after <= before + 2, (before, after, out)
    if user == "alice":
        assert "errors 0 " in out and "hostile-run" in out, out
    else:
        assert "errors 40 " in out and "hostile-run" not in out, out


@pytest.mark.parametrize("mode", ["read_end", "socket", "devnull", "same"])
def test_odd_descriptors_for_the_output_do_not_stall_or_leak_the_daemon(
    bed: Testbed, mode: str
) -> None:
    """The daemon copies only to the write end of an anonymous pipe: a read
    end, a socket, /dev/null or one pipe given three times get the old path
    (or a refusal), the daemon stays up, answers, and keeps no descriptor."""
    pid = _daemon_pid(bed)
    before = _daemon_fds(bed)
    out = _hostile(bed, "alice", mode, 5)
    _agents_end(bed, "alice")
    t0 = time.monotonic()
    bed.run(["lev", "ps"], user="bob")
    assert time.monotonic() - t0 < 5
    after = _settle_fds(bed, before)
    assert _daemon_pid(bed) == pid
    assert after <= before + 2, (before, after, out)


FORGE = (
    "printf 'forge-a LEVIATH_EVENT=start\\n_SYSTEMD_UNIT=leviathd.service\\nLEVIATH_EVENT=start\\n"
    "_UID=0\\nforge-nul\\000_PID=1\\nforge-bad-\\377\\376-utf8\\n'; "
    "head -c 100000 /dev/zero | tr '\\0' L; echo; printf 'forge-end-no-newline'"
)


def test_agent_output_cannot_forge_journal_fields_or_another_identity(bed: Testbed) -> None:
    """An attached agent writes field-like lines, a NUL, invalid UTF-8, a
    100 KB line and no final newline: each is a MESSAGE of alice's under
    the agent's unit; no record carries a field it wrote (LEVIATH_EVENT,
    another unit, uid 0). Passed before (journald's stream protocol has no
    fields), kept as the guard of the daemon's copy."""
    home = bed.users["alice"].home
    r = bed.run(["lev", "run", "--workdir", f"{home}/work", "--", "sh", "-c", FORGE],
                user="alice", check=False, timeout=120)
    rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="alice").stdout)
    unit = next(row["unit"] for row in rows if row["command"] == ["sh", "-c", FORGE])
    assert "forge-end-no-newline" in r.stdout, r.stdout[-300:]
    deadline = time.monotonic() + 15
    entries: list[dict] = []
    while time.monotonic() < deadline:
        out = bed.run(["journalctl", "--no-pager", "-q", "-o", "json", "--all",
                       "--since", "-5min"], check=False).stdout
        entries = [json.loads(x) for x in out.splitlines()]
        mine = [e for e in entries if "forge" in str(e.get("MESSAGE", ""))
                or e.get("_SYSTEMD_UNIT") == unit]
        if any("forge-end-no-newline" in str(e.get("MESSAGE")) for e in mine):
            break
        time.sleep(0.5)
    uid = str(bed.users["alice"].uid)
    agent_lines = [e for e in mine if e.get("SYSLOG_IDENTIFIER") != "leviathd"]
    assert agent_lines, mine
    for e in agent_lines:
        assert e.get("_SYSTEMD_UNIT") == unit and e.get("_UID") == uid, e
        assert "LEVIATH_EVENT" not in e and "LEVIATH_AGENT" not in e, e
    messages = [str(e.get("MESSAGE")) for e in agent_lines]
    assert "_SYSTEMD_UNIT=leviathd.service" in messages and "_UID=0" in messages
    assert any(m.startswith("forge-end-no-newline") for m in messages), messages[-3:]
