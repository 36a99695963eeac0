"""Issue 9 §4: a credential command gets its secret on a pipe (its standard
input), never in its environment, and its user cannot look into it while it
runs: alice, owner of the agent and the uid the command runs as, tries
/proc/<pid>/environ, mem (at the addresses of its maps) and fd/0 of a
machine credential's command holding a root-only secret."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

SECRET = "root-only-s3cret-4711"
HOLD = (
    "import os, sys, time\n"
    "secret = sys.stdin.readline()\n"
    "open('cred.pid.tmp', 'w').write(str(os.getpid())); os.rename('cred.pid.tmp', 'cred.pid')\n"
    "time.sleep(12)\n"
    "print('used', len(secret.strip()))\n"
)
CONFIG = f"""
[sandbox]
kind = "namespace"

[credentials.hold]
command = ["python3", "-c", {HOLD!r}]
secret_file = "/etc/leviath/hold.key"
"""

PEEK = r"""
import sys
pid, secret = sys.argv[1], sys.argv[2].encode()
found, errors = [], []
def attempt(what, fn):
    try:
        data = fn()
    except OSError as e:
        errors.append(f"{what}: {e.strerror}")
        return
    if secret in data:
        found.append(what)
def environ():
    return open(f"/proc/{pid}/environ", "rb").read()
def mem():
    out = b""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb") as m:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if "r" not in line.split()[1] or hi - lo > 1 << 28:
                continue
            try:
                m.seek(lo); out += m.read(hi - lo)
            except OSError:
                pass
    return out
def fd0():
    return open(f"/proc/{pid}/fd/0", "rb").read(4096)
attempt("environ", environ)
attempt("mem", mem)
attempt("fd0", fd0)
print("FOUND", found)
print("ERRORS", errors)
"""


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/hold.key", SECRET + "\n", mode=0o600)
    testbed.write_file("/tmp/peek.py", PEEK)
    try:
        with testbed.machine_config(CONFIG):
            yield testbed
    finally:
        testbed.run(["rm", "-f", "/etc/leviath/hold.key"])


def test_the_owner_cannot_read_a_running_credential_commands_secret(bed: Testbed) -> None:
    work = f"{bed.users['alice'].home}/credw"
    bed.run(f"mkdir -p {work} && rm -f {work}/cred.pid {work}/cred.out", user="alice")
    agent_id = bed.run(["lev", "run", "-d", "--", "sh", "-c",
                        "lev tool credential hold > cred.out 2>&1; sleep 30"],
                       user="alice", cwd=work).stdout.strip()
    try:
        # The command runs in a fence of its own with a private working folder
        # (issue 21), so root finds its host pid by the file it made there.
        deadline = time.monotonic() + 20
        pid = ""
        while not pid:
            assert time.monotonic() < deadline, bed.run(["cat", f"{work}/cred.out"],
                                                         check=False).stdout
            time.sleep(0.1)
            pid = bed.run(["sh", "-c", "for p in $(pgrep -u alice python3); do "
                           "[ -e /proc/$p/cwd/cred.pid ] && echo $p; done"],
                          check=False).stdout.strip()
        uid = bed.run(["stat", "-c", "%u", f"/proc/{pid}"]).stdout.strip()
        assert uid == str(bed.users["alice"].uid)  # it runs as alice...
        peek = bed.run(["python3", "/tmp/peek.py", pid, SECRET], user="alice").stdout
        assert "FOUND []" in peek, peek  # ...who cannot see the secret in it
        assert "environ: Permission denied" in peek and "mem: Permission denied" in peek, peek
        # Not in its environment at all (root looks).
        assert SECRET not in bed.run(["cat", f"/proc/{pid}/environ"]).stdout
        deadline = time.monotonic() + 30
        while "used" not in bed.run(["cat", f"{work}/cred.out"], check=False).stdout:
            assert time.monotonic() < deadline
            time.sleep(0.3)
        out = bed.read_file(f"{work}/cred.out")
        assert f"used {len(SECRET)}" in out, out  # the command did get the secret
    finally:
        bed.run(["lev", "stop", agent_id], user="alice", check=False)
