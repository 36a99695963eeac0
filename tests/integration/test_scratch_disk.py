"""Issue 33, item 1, in the test bed: an agent's home, /tmp and throwaway
layer are on disk (an ext4 of its own on a loop device, sandbox/loopfs.py),
bounded by `scratch_size`, not charged to `memory_max`, and gone however
the agent ends. Each test failed on the tmpfs scratch before (the commit
message says how)."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator

import pytest
from journal_wait import journal_with
from testbed import Testbed

SCRATCH = "/var/lib/leviath/scratch"
CONFIG = """
[sandbox]
kind = "namespace"
{extra}

[resources]
memory_max = "64M"
tasks_max = 64
"""
# The device of the agent's /tmp mount, as its own mount table says.
TMP_DEVICE = "awk '$5 == \"/tmp\" {print $3}' /proc/self/mountinfo"


def configure(bed: Testbed, extra: str = "") -> None:
    bed.write_file("/etc/leviath/config.toml", CONFIG.format(extra=extra))
    bed.run(["systemctl", "reload-or-restart", "leviathd"])


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.run(["systemctl", "start", "leviathd"])
    configure(testbed)
    for user in ("alice", "bob"):
        testbed.run(["mkdir", "-p", "work"], user=user)
    yield testbed
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "reload-or-restart", "leviathd"])


def lev(bed: Testbed, *args: str, user: str = "alice", check: bool = True, timeout: float = 120):
    cwd = f"{bed.users[user].home}/work"
    return bed.run(["lev", *args], user=user, cwd=cwd, check=check, timeout=timeout)


def start(bed: Testbed, *command: str, user: str = "alice") -> str:
    return lev(bed, "run", "--detach", "--", *command, user=user).stdout.strip()


def info(bed: Testbed, agent_id: str, user: str = "alice") -> dict:
    rows = json.loads(lev(bed, "ps", "--all", "--json", user=user).stdout)
    return next(r for r in rows if r["id"] == agent_id)


def wait_until(what: str, check, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"not so after {timeout}s: {what}")


def wait_ended(bed: Testbed, agent_id: str, user: str = "alice") -> dict:
    wait_until(f"{agent_id} ended", lambda: info(bed, agent_id, user)["state"] != "running")
    return info(bed, agent_id, user)


def backing_of(bed: Testbed, device: str) -> str:
    """What the loop device `device` (major:minor) is backed by now, "" if
    it is no loop device or backs nothing."""
    r = bed.run(["cat", f"/sys/dev/block/{device}/loop/backing_file"], check=False)
    return r.stdout.strip() if r.returncode == 0 else ""


def running_scratch(bed: Testbed, script: str, user: str = "alice") -> tuple[str, str, str]:
    """Start a detached agent that says where its /tmp lives, then runs
    `script`: (its id, its /tmp's device, that device's backing file)."""
    agent_id = start(bed, "sh", "-c", f"{TMP_DEVICE}; {script}", user=user)
    wait_until("its /tmp device logged",
               lambda: ":" in lev(bed, "logs", agent_id, user=user).stdout)
    device = lev(bed, "logs", agent_id, user=user).stdout.strip().splitlines()[0].strip()
    backing = backing_of(bed, device)
    # A loop device's file, unnamed (O_TMPFILE): no name reaches it (the
    # kernel shows "#inode (deleted)", the path as the daemon's mount sees it).
    assert "/#" in backing and backing.endswith(" (deleted)"), backing
    return agent_id, device, backing


def daemon_pid(bed: Testbed) -> str:
    return bed.run(["systemctl", "show", "-P", "MainPID", "leviathd"]).stdout.strip()


def daemon_files(bed: Testbed) -> str:
    pid = daemon_pid(bed)
    return bed.run(["sh", "-c", f"ls -l /proc/{pid}/fd/ 2>/dev/null"], check=False).stdout


def assert_all_gone(bed: Testbed, agent_id: str, device: str, backing: str) -> None:
    # The loop device lets go of the file when the agent's last mount goes
    # (its namespaces die with its last process): waited for, not timed.
    wait_until(f"{device} let go of {backing}", lambda: backing_of(bed, device) != backing)
    # Nor does the daemon keep its copy of the file (closed once it ended).
    wait_until("the daemon let go of the file", lambda: backing.removesuffix(" (deleted)")
               not in daemon_files(bed))
    wait_until(f"{SCRATCH}/{agent_id} removed",
               lambda: bed.run(["test", "-e", f"{SCRATCH}/{agent_id}"],
                               check=False).returncode != 0)  # fmt: skip


def test_an_agent_writes_200_mb_into_tmp_with_a_64_mb_memory_limit(bed: Testbed) -> None:
    # On a tmpfs the 200 MB were the agent's memory: the OOM killer ended it.
    r = lev(bed, "run", "--", "sh", "-c",
            "dd if=/dev/zero of=/tmp/big bs=1M count=200 2>&1 && sync /tmp/big && "
            "stat -c %s /tmp/big && stat -f -c %T /tmp ~", check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.split()
    assert str(200 << 20) in out, r.stdout
    assert out[-2:] == ["ext2/ext3", "ext2/ext3"], r.stdout
    rows = json.loads(lev(bed, "ps", "--all", "--json").stdout)
    assert rows[-1]["state"] == "exited", rows[-1]


def test_writing_past_scratch_size_fails_with_enospc_and_other_users_are_unaffected(
    bed: Testbed,
) -> None:
    configure(bed, 'scratch_size = "48M"')
    try:
        # Bob's agent holds 32 MB of its own scratch while alice fills hers.
        bob, _, _ = running_scratch(bed, "dd if=/dev/zero of=/tmp/b bs=1M count=32 2>&1; "
                                    "sleep 300", user="bob")
        r = lev(bed, "run", "--", "sh", "-c",
                "dd if=/dev/zero of=/tmp/big bs=1M count=100 2>&1; echo dd-rc=$?; "
                "dd if=/dev/zero of=$HOME/more bs=1M count=8 2>&1; echo home-rc=$?",
                check=False)  # fmt: skip
        assert "No space left on device" in r.stdout, r.stdout
        # Home and /tmp share the one limit.
        assert "dd-rc=1" in r.stdout and "home-rc=1" in r.stdout, r.stdout
        # The host's disk is not full, and bob's scratch is his own.
        assert bed.run(["sh", "-c", f"echo ok > {SCRATCH}/.probe && cat {SCRATCH}/.probe && "
                        f"rm {SCRATCH}/.probe"]).stdout.strip() == "ok"  # fmt: skip
        wait_until("bob's 32 MB written", lambda: "32+0 records out" in
                   lev(bed, "logs", bob, user="bob").stdout)
        assert "No space" not in lev(bed, "logs", bob, user="bob").stdout
        lev(bed, "stop", bob, user="bob")
        wait_ended(bed, bob, "bob")
    finally:
        configure(bed)


def test_nothing_of_the_scratch_stays_after_lev_stop(bed: Testbed) -> None:
    agent_id, device, backing = running_scratch(bed, "echo h > ~/h; sleep 300")
    lev(bed, "stop", agent_id)
    assert wait_ended(bed, agent_id)["state"] == "stopped"
    assert_all_gone(bed, agent_id, device, backing)


# PID 1 of the agent's PID namespace, among its scope's processes.
FIND_PID1 = r"""
for p in $(cat /sys/fs/cgroup/systemd/leviath.slice/"$1"/cgroup.procs); do
  ns=$(awk '/^NSpid:/ {print $NF, NF}' /proc/$p/status 2>/dev/null)
  if [ "$ns" = "1 3" ]; then echo $p; fi
done
"""


def test_nothing_of_the_scratch_stays_after_a_kill_of_pid_1(bed: Testbed) -> None:
    agent_id, device, backing = running_scratch(bed, "sleep 300")
    unit = info(bed, agent_id)["unit"]
    pid1 = bed.run(["sh", "-c", FIND_PID1, "find", unit]).stdout.split()
    assert len(pid1) == 1, pid1
    bed.run(["kill", "-KILL", pid1[0]])
    wait_ended(bed, agent_id)
    assert_all_gone(bed, agent_id, device, backing)


def test_nothing_of_the_scratch_stays_when_the_agent_ends_while_the_daemon_is_down(
    bed: Testbed,
) -> None:
    agent_id, device, backing = running_scratch(bed, "sleep 3")
    bed.run(["systemctl", "kill", "--signal=SIGKILL", "leviathd"])
    bed.run(["systemctl", "stop", "leviathd"])
    try:
        # Ended with nobody to clean up: the device still lets go (its last
        # mount went with the agent's namespaces).
        wait_until(f"{device} let go", lambda: backing_of(bed, device) != backing)
    finally:
        bed.run(["systemctl", "start", "leviathd"])
    wait_ended(bed, agent_id)
    assert_all_gone(bed, agent_id, device, backing)


def test_an_agent_whose_scratch_cannot_be_removed_still_ends_for_its_caller(
    bed: Testbed,
) -> None:
    # The removal of the scratch folder is part of an agent's end; when it
    # fails (here: a mount an admin left on the folder), the end must still
    # be recorded and told, or the agent stays "running" for ever and an
    # attached `lev run` never returns (before: it waited out its timeout).
    before = set(bed.run(["ls", SCRATCH]).stdout.split())
    cwd = f"{bed.users['alice'].home}/work"
    attached = subprocess.Popen(
        bed.command(["lev", "run", "--", "sh", "-c",
                     "until [ -e go ]; do sleep 0.1; done; echo done; exit 3"],
                    user="alice", cwd=cwd),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mounted = ""
    try:
        def new_folder() -> bool:
            nonlocal mounted
            fresh = set(bed.run(["ls", SCRATCH]).stdout.split()) - before
            mounted = next(iter(fresh), "")
            return bool(mounted)
        wait_until("the agent's scratch folder", new_folder)
        # In the daemon's own mount namespace (the unit's sandboxing gives it
        # one): a mount on the host's side would not be its to see.
        bed.run(["nsenter", "-t", daemon_pid(bed), "-m", "mount", "-t", "tmpfs", "-o",
                 "size=1M", "pinned", f"{SCRATCH}/{mounted}"])
        # The agent ends only now: its folder is surely mounted over by then
        # (a fixed sleep in the agent could end first on a loaded machine).
        bed.run(["touch", f"{cwd}/go"], user="alice")
        out, err = attached.communicate(timeout=90)
        assert attached.returncode == 3 and "done" in out, (out, err)
        rows = json.loads(lev(bed, "ps", "--all", "--json").stdout)
        states = [r["state"] for r in rows if r["id"] == mounted]
        assert states == ["exited"], (rows, bed.journal("leviathd")[-3000:])
        logged = journal_with(bed, ["-u", "leviathd", "-o", "cat"],
                              f"agent {mounted}: removing its scratch failed",
                              f"scratch folder {mounted} is still mounted here")
        assert f"scratch folder {mounted} is still mounted here" in logged, logged[-2000:]
    finally:
        if attached.poll() is None:
            attached.kill()
            attached.wait()
        bed.run(["rm", "-f", f"{cwd}/go"], check=False)
        if mounted:
            bed.run(["nsenter", "-t", daemon_pid(bed), "-m", "umount", f"{SCRATCH}/{mounted}"],
                    check=False)
            bed.run(["rmdir", f"{SCRATCH}/{mounted}"], check=False)


TINY = "/var/lib/leviath/scratch-tiny"


def test_a_scratch_that_cannot_be_made_refuses_the_start_with_the_reason(bed: Testbed) -> None:
    """Issue 48 §5: `scratch_dir`'s filesystem full (here a 4 KiB tmpfs,
    as another user's agents may leave it): the start is refused and says
    why, instead of an agent that dies with status 127 and no word (seen
    so before: exit 127, nothing on stderr about the scratch)."""
    bed.run(f"mkdir -p {TINY} && mount -t tmpfs -o size=4k,mode=0700 tmpfs {TINY}")
    try:
        # (a bound by size: this disk is too small for any share of it)
        configure(bed, f'scratch_dir = "{TINY}"\nscratch_size = "64M"\n'
                       'scratch_user_max = "1T"')
        bed.run(["systemctl", "restart", "leviathd"])  # its mount namespace sees the tmpfs
        r = lev(bed, "run", "--", "echo", "ran", user="bob", check=False)
        assert r.returncode != 0 and r.returncode != 127, (r.returncode, r.stdout, r.stderr)
        assert "ran" not in r.stdout
        assert "scratch" in r.stderr and "No space left on device" in r.stderr, r.stderr
        rows = json.loads(lev(bed, "ps", "--all", "--json", user="bob").stdout)
        assert not any(row.get("command") == ["echo", "ran"] for row in rows), rows
    finally:
        configure(bed)
        bed.run(["umount", TINY], check=False)


SMALL = "/var/lib/leviath/scratch-small"


def test_one_users_agents_cannot_fill_the_scratch_disk_under_anothers(bed: Testbed) -> None:
    """Issue 48 §5: each user's agents may take at most `scratch_user_max`
    of scratch_dir's filesystem (here 50% of a 256 MiB one, 64 MiB each):
    alice's third agent is refused with the reason, her first two fill their
    whole scratch, and bob's running agent and his new one keep writing
    (before: alice filled the disk within her limits and bob's writes
    failed, his scratch remounted read-only)."""
    bed.run(f"mkdir -p {SMALL} && mount -t tmpfs -o size=256m,mode=0700 tmpfs {SMALL}")
    started: list[tuple[str, str]] = []
    try:
        configure(bed, f'scratch_dir = "{SMALL}"\nscratch_size = "64M"\n'
                       'scratch_user_max = "50%"')
        bed.run(["systemctl", "restart", "leviathd"])  # its mount namespace sees the tmpfs
        fill = "dd if=/dev/zero of=/tmp/fill bs=1M count=80 2>/dev/null; echo filled; sleep 600"
        for _ in range(2):
            started.append(("alice", start(bed, "sh", "-c", fill)))
        r = lev(bed, "run", "--", "echo", "third", check=False)
        assert r.returncode != 0 and "scratch_user_max" in r.stderr, (r.stdout, r.stderr)
        keep = ("i=0; while [ $i -lt 40 ]; do dd if=/dev/zero of=/tmp/w$i bs=1M count=1 "
                "2>/dev/null || exit 9; i=$((i+1)); done; echo wrote; sleep 600")
        started.append(("bob", start(bed, "sh", "-c", keep, user="bob")))
        for who, agent_id in started:
            word = "filled" if who == "alice" else "wrote"
            wait_until(f"{who}'s {agent_id} {word}", lambda a=agent_id, w=who, x=word:
                       x in lev(bed, "logs", a, user=w).stdout)
            assert info(bed, agent_id, user=who)["state"] == "running", who
        r = lev(bed, "run", "--", "sh", "-c", "dd if=/dev/zero of=/tmp/x bs=1M count=40 "
                "2>/dev/null && echo new-ok", user="bob", check=False)
        assert r.returncode == 0 and "new-ok" in r.stdout, (r.stdout, r.stderr)
    finally:
        for who, agent_id in started:
            lev(bed, "stop", agent_id, user=who, check=False)
        for who, agent_id in started:
            wait_ended(bed, agent_id, who)
        configure(bed)
        bed.run(["systemctl", "restart", "leviathd"])
        bed.run(["umount", SMALL], check=False)


def scratch_files(bed: Testbed) -> set[str]:
    """The unnamed scratch files the daemon holds: running agents' and those
    made ahead (sandbox/scratchpool.py)."""
    return {line.split(" -> ", 1)[1].removesuffix(" (deleted)")
            for line in daemon_files(bed).splitlines()
            if f" -> {SCRATCH}/#" in line}


def test_a_scratch_made_ahead_carries_nothing_from_one_agent_to_another(bed: Testbed) -> None:
    """Issue 47 item 2: a start takes a scratch filesystem made ahead. From
    inside the agents: alice's writes a marker into its /tmp and home and
    flushes it to its disk; bob's next agent, whose scratch was made before
    it started, is another file and finds nothing of it, nor does his
    agent after alice's ended (each image is given once and never back)."""
    marker = "MARK" + secrets.token_hex(8)
    probe = (f"if grep -rqs {marker} /tmp ~ || [ -e /tmp/m ] || [ -e ~/m ]; then echo LEAK; "
             "fi; echo probe-done")
    cwd = f"{bed.users['alice'].home}/work"
    bob_cwd = f"{bed.users['bob'].home}/work"
    # Each waits for its go file: its loop device is read while it runs.
    wait_go = "until [ -e go ]; do sleep 0.1; done"
    alice, _dev, a_file = running_scratch(
        bed, f"echo {marker} > /tmp/m; echo {marker} > ~/m; sync; echo written; "
             f"{wait_go}")
    bob = ""
    try:
        wait_until("alice's marker written", lambda: "written" in lev(bed, "logs", alice).stdout)
        a_file = a_file.removesuffix(" (deleted)")
        # The pool makes new ones in its own thread after each start.
        wait_until("a scratch made ahead", lambda: len(scratch_files(bed) - {a_file}) >= 1)
        ahead = scratch_files(bed) - {a_file}
        bob, _dev, b_file = running_scratch(bed, f"{probe}; {wait_go}", user="bob")
        b_file = b_file.removesuffix(" (deleted)")
        assert b_file != a_file
        assert b_file in ahead, (b_file, ahead)  # made before bob's start
        wait_until("bob's probe", lambda: "probe-done" in lev(bed, "logs", bob, user="bob").stdout)
        assert "LEAK" not in lev(bed, "logs", bob, user="bob").stdout
    finally:
        bed.run(["touch", f"{cwd}/go"], user="alice")
        bed.run(["touch", f"{bob_cwd}/go"], user="bob")
    wait_ended(bed, alice)
    if bob:
        wait_ended(bed, bob, "bob")
    bed.run(["rm", "-f", f"{cwd}/go"], user="alice")
    bed.run(["rm", "-f", f"{bob_cwd}/go"], user="bob")
    r = lev(bed, "run", "--", "sh", "-c", probe, user="bob")
    assert "probe-done" in r.stdout and "LEAK" not in r.stdout, r.stdout
