"""A user at the kernel's key quota gets a refused start that says why, not
an accepted start whose agent ends at once with 127 (issue 46,
agents/admission.py).

The quota is the kernel's, per uid, host-wide: every bed on this host shares
it for a uid. So the test makes a user of its own, with a uid drawn at
random far above the ones useradd hands out, fills that uid's quota from a
process of its own (keys in a session keyring only that process holds), and
ends the process before it leaves: its keys go with it, and the test waits
until the kernel says the uid holds none."""

from __future__ import annotations

import json
import random
import subprocess
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed
from testbed.boot import User

pytestmark = pytest.mark.testbed

FILLER = "/usr/local/lib/leviath-keyfill.py"
FILLER_TEXT = r'''
import ctypes, errno, platform, sys

libc = ctypes.CDLL(None, use_errno=True)
KEYCTL = {"x86_64": 250, "aarch64": 219}[platform.machine()]
ADD_KEY = {"x86_64": 248, "aarch64": 217}[platform.machine()]
SESSION = -3
# A session keyring of this process alone: its keys go when it ends.
if libc.syscall(KEYCTL, 1, b"leviath-test-keyfill", 0, 0, 0) < 0:
    sys.exit(f"join: {ctypes.get_errno()}")
added = 0
while added < 100000:
    d = f"k{added}".encode()
    if libc.syscall(ADD_KEY, b"user", d, b"x", ctypes.c_size_t(1), ctypes.c_long(SESSION)) < 0:
        err = ctypes.get_errno()
        if err != errno.EDQUOT:
            sys.exit(f"add_key: {err}")
        break
    added += 1
print("full", added, flush=True)
sys.stdin.read()  # held until the test closes stdin
'''


def key_line(bed: Testbed, uid: int) -> str:
    """The uid's line of /proc/key-users ("" when it holds no key)."""
    text = bed.run(["cat", "/proc/key-users"]).stdout
    return next((ln for ln in text.splitlines() if ln.split(":")[0].strip() == str(uid)), "")


def wait_no_keys(bed: Testbed, uid: int) -> None:
    # The kernel's key collector frees an unreferenced keyring soon after,
    # not at once: waited for, with a bound.
    deadline = time.monotonic() + 60
    while (line := key_line(bed, uid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not line, f"uid {uid} still holds keys: {line}"


@pytest.fixture
def quota_user(testbed: Testbed) -> Iterator[User]:
    testbed.write_file(FILLER, FILLER_TEXT)
    testbed.run(["groupadd", "-f", "leviath"])
    uid = random.randrange(3_000_000, 2_000_000_000)
    name = f"kq{uid}"
    testbed.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/bash",
                 "--uid", str(uid), "--groups", "leviath", name])
    gid = int(testbed.run(["id", "-g", name]).stdout)
    home = testbed.run(["getent", "passwd", name]).stdout.split(":")[5]
    user = User(name, uid, gid, home, ("leviath",))
    testbed.users[name] = user
    testbed.run(["mkdir", "-p", "work"], user=name)
    try:
        yield user
    finally:
        running = testbed.run(["lev", "ps", "--json"], user=name, check=False).stdout
        for item in json.loads(running or "[]"):
            testbed.run(["lev", "stop", item["id"]], user=name, check=False)
        wait_no_keys(testbed, uid)
        testbed.users.pop(name, None)


def test_a_user_at_the_key_quota_is_refused_with_the_reason(
        testbed: Testbed, quota_user: User) -> None:
    testbed.start_service("leviathd.service")
    name, uid = quota_user.name, quota_user.uid
    assert not key_line(testbed, uid), "a fresh uid holds no keys"
    filler = subprocess.Popen(testbed.command(["python3", FILLER], user=name),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert filler.stdout is not None
        ready = filler.stdout.readline()
        assert ready.startswith("full "), ready
        assert key_line(testbed, uid), "the filler holds the quota"

        cwd = f"{quota_user.home}/work"
        r = testbed.run(["lev", "run", "--detach", "--", "sleep", "30"], user=name, cwd=cwd,
                        check=False)
        assert r.returncode != 0, f"accepted at the quota: {r.stdout}{r.stderr}"
        assert "kernel.keys.maxkeys" in r.stderr and "key quota" in r.stderr, r.stderr
        # Nothing was started: no agent that ended at once, running or ended.
        listed = json.loads(testbed.run(["lev", "ps", "--all", "--json"], user=name,
                                        cwd=cwd).stdout)
        assert listed == [], listed
    finally:
        assert filler.stdin is not None
        filler.stdin.close()
        filler.wait(timeout=30)
    wait_no_keys(testbed, uid)

    # With the keys gone the same start runs: the refusal was the quota's.
    ok = testbed.run(["lev", "run", "--", "sh", "-c", "echo ran-after-quota"], user=name,
                     cwd=f"{quota_user.home}/work")
    assert "ran-after-quota" in ok.stdout, ok
