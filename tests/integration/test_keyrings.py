"""Keyrings are per agent and per credential command (issue 23 §3), across two
users in the bed: dave's unsandboxed agent keeps a key in its session keyring,
alice's credential command and her agent look for it, and the other way round.
Credential commands also lose the bounding set and get no_new_privs, like
every other process started for a user."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

pytestmark = pytest.mark.testbed

PROBE = "/usr/local/lib/leviath-keyprobe.py"
PROBE_TEXT = r'''
import ctypes, platform, sys

libc = ctypes.CDLL(None, use_errno=True)
KEYCTL = {"x86_64": 250, "aarch64": 219}[platform.machine()]
ADD_KEY = {"x86_64": 248, "aarch64": 217}[platform.machine()]
SESSION = -3

def keyctl(*a):
    return libc.syscall(KEYCTL, *[ctypes.c_long(x) if isinstance(x, int) else x for x in a])

def read(serial):
    buf = ctypes.create_string_buffer(65536)
    n = keyctl(11, serial, buf, 65536)  # KEYCTL_READ
    return buf.raw[:n] if n >= 0 else b""

def describe(serial):
    buf = ctypes.create_string_buffer(4096)
    n = keyctl(6, serial, buf, 4096)  # KEYCTL_DESCRIBE
    return buf.value.decode(errors="replace") if n >= 0 else "?"

def dump():
    ses = keyctl(0, SESSION, 0)  # KEYCTL_GET_KEYRING_ID
    print("session", ses, describe(ses))
    ids = read(SESSION)
    for i in range(0, len(ids), 4):
        serial = int.from_bytes(ids[i:i + 4], "little")
        print("key", serial, describe(serial), read(serial).decode(errors="replace"))
    for line in open("/proc/self/status"):
        if line.startswith(("CapBnd", "CapEff", "CapPrm", "NoNewPrivs", "Uid")):
            print(line.strip())

if sys.argv[1] == "add":
    serial = libc.syscall(ADD_KEY, b"user", sys.argv[2].encode(), sys.argv[3].encode(),
                          ctypes.c_size_t(len(sys.argv[3])), ctypes.c_long(SESSION))
    print("added", serial, ctypes.get_errno())
dump()
'''

CONFIG = """
[sandbox]
kind = "none"

[credentials.kr]
command = ["python3", "/usr/local/lib/leviath-keyprobe.py"]
secret_file = "/etc/leviath/kr.key"
"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file(PROBE, PROBE_TEXT)
    testbed.write_file("/etc/leviath/kr.key", "kr-secret\n", mode=0o600)
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    testbed.run(["systemctl", "restart", "leviathd"])
    for user in ("alice", "dave"):
        testbed.run(["mkdir", "-p", "kr"], user=user)
    yield testbed


def run(bed: Testbed, user: str, *command: str, detach: bool = False) -> str:
    cwd = f"{bed.users[user].home}/kr"
    args = ["lev", "run", *(["--detach"] if detach else []), "--", *command]
    return bed.run(args, user=user, cwd=cwd).stdout


def credential(bed: Testbed, user: str, *args: str) -> str:
    out = run(bed, user, "lev", "tool", "credential", "kr", *args)
    result = json.loads(out)
    assert result["exit_status"] == 0, result
    return str(result["stdout"])


def test_credential_commands_and_agents_never_share_a_session_keyring(bed: Testbed) -> None:
    # dave's unsandboxed agent keeps a key and stays up.
    dave_id = run(bed, "dave", "sh", "-c",
                  f"python3 {PROBE} add dave-key DAVE-KEYRING-SECRET-77; sleep 30",
                  detach=True).strip()
    try:
        # Its output waited for, with a bound (the start and journald may
        # both take their time on a loaded machine).
        deadline = time.monotonic() + 60
        while True:
            dave_log = bed.run(["lev", "logs", dave_id], user="dave").stdout
            seen = "DAVE-KEYRING-SECRET-77" in dave_log and re.search(
                r"^session \d+", dave_log, re.M)
            if seen or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert "DAVE-KEYRING-SECRET-77" in dave_log, dave_log  # the key is there for dave
        # alice's credential command, her agent: neither sees it.
        cred = credential(bed, "alice", "dump")
        assert "DAVE-KEYRING-SECRET-77" not in cred, cred
        own = run(bed, "alice", "python3", PROBE, "dump")
        assert "DAVE-KEYRING-SECRET-77" not in own, own
        # A key alice's credential command plants reaches nobody else.
        planted = credential(bed, "alice", "add", "alice-key", "ALICE-PLANTED-KEY-5")
        assert "ALICE-PLANTED-KEY-5" in planted, planted
        nxt = run(bed, "dave", "python3", PROBE, "dump")
        assert "ALICE-PLANTED-KEY-5" not in nxt, nxt
        again = credential(bed, "alice", "dump")
        assert "ALICE-PLANTED-KEY-5" not in again, again
        sessions = {re.search(r"^session (\d+)", t, re.M).group(1)  # type: ignore[union-attr]
                    for t in (cred, own, nxt, again, dave_log)}
        assert len(sessions) == 5, sessions
    finally:
        bed.run(["lev", "stop", dave_id], user="dave", check=False)


def test_a_credential_command_has_no_bounding_set_and_no_new_privs(bed: Testbed) -> None:
    out = credential(bed, "alice", "dump")
    status = dict(line.split(":\t", 1) for line in out.splitlines() if ":\t" in line)
    assert status["CapBnd"] == "0000000000000000", out
    assert status["CapEff"] == status["CapPrm"] == "0000000000000000", out
    assert status["NoNewPrivs"] == "1", out
    uid = str(bed.users["alice"].uid)
    assert status["Uid"].split() == [uid] * 4, out
