"""Red team for issue 18's attached agents without a supervisor, polkit
answered beside the start, and the fence's recursive lock: attacks from a
hostile D-Bus client (alice, or carol whom polkit refuses) and from inside
an agent, each written from the attacker's side in the test bed."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
import quiescent
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
    """Its open files, less the scratch pool's (quiescent.FDS)."""
    return int(bed.run(["sh", "-c", quiescent.FDS.replace("$pid", str(_daemon_pid(bed)))],
                       check=False).stdout.strip() or 0)


def _settle_fds(bed: Testbed, before: int, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    now = _daemon_fds(bed)
    while now > before + 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        now = _daemon_fds(bed)
    if now > before + 2:  # what is left open, for the failure's reader
        print(bed.run(["ls", "-l", f"/proc/{_daemon_pid(bed)}/fd"], check=False).stdout)
    return now


def _hostile(bed: Testbed, user: str, mode: str, n: int) -> str:
    work = f"{bed.users[user].home}/work"
    return bed.run([VENV_PY, "/tmp/hostile.py", mode, str(n), work], user=user,
                   check=False, timeout=300).stdout


# What the daemon says when the event loop lost an agent's end and its
# recheck took it (docs/operations.md): the caller saw nothing wrong, but
# the loop failed, as it did for CI4's agent that never ended.
LOST_END = "not heard from the event loop|still registered with the event loop"


def _agents_end(bed: Testbed, user: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = json.loads(bed.run(["lev", "ps", "--json"], user=user).stdout)
        if not rows:
            lost = bed.run(["sh", "-c", "journalctl -u leviathd --no-pager -o cat | "
                            f"grep -E '{LOST_END}' || true"], check=False).stdout
            assert not lost, f"the event loop lost agents' ends:\n{lost}"
            return
        time.sleep(0.3)
    try:
        # What each one's processes are doing, for a hang seen once in a
        # whole run (CI4 of 2026-12-02): its bed is gone by the time anyone looks.
        state = "\n".join(_processes(bed, row["unit"]) for row in rows)
        # Then stopped: the tests after this one must not fail for its leftover.
        for row in rows:
            bed.run(["lev", "stop", row["id"]], user=user, check=False, timeout=30)
    except Exception as exc:  # the diagnosis must not hide the failure
        state = f"(could not read the processes: {exc!r})"
    raise AssertionError(f"{user}'s agents still running: {rows}\n{state}")


PROCESSES = r"""
f=$(find /sys/fs/cgroup -type d -name "$1" 2>/dev/null | head -1)/cgroup.procs
if [ ! -r "$f" ]; then echo "(its scope is gone)"; else
  for p in $(cat "$f"); do
    echo "pid $p: $(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | cut -c1-120)"
    grep -E '^(State|PPid|NSpid|Threads):' /proc/$p/status 2>/dev/null | tr '\n' ' '
    echo "wchan=$(cat /proc/$p/wchan 2>/dev/null)"
    cat /proc/$p/stack 2>/dev/null | head -8
  done
fi
"""


def _processes(bed: Testbed, unit: str) -> str:
    """The unit's processes: cmdline, state, kernel wait and stack."""
    r = bed.run(["sh", "-c", PROCESSES, "procs", unit], check=False, timeout=30)
    return f"{unit}:\n{r.stdout}{r.stderr}"


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
    bed.run(["lev", "ps"], user="bob", timeout=60)  # answered (a stall fails the timeout)
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


REFUSED = r"""
import asyncio, os, sys
from dbus_fast import BusType, Message, MessageType, Variant
from dbus_fast.aio import MessageBus

async def one(bus, req, attached):
    if attached:
        r, w = os.pipe()
        msg = Message(destination="org.leviath.Manager1", path="/org/leviath/Manager1",
                      interface="org.leviath.Manager1", member="RunAttached",
                      signature="a{sv}hhh", body=[req, 0, 1, 1], unix_fds=[r, w])
    else:
        msg = Message(destination="org.leviath.Manager1", path="/org/leviath/Manager1",
                      interface="org.leviath.Manager1", member="Run", signature="a{sv}",
                      body=[req])
    reply = await bus.call(msg)
    return reply.error_name if reply.message_type is MessageType.ERROR else "ran"

async def main(home):
    bus = await MessageBus(bus_type=BusType.SYSTEM, negotiate_unix_fd=True).connect()
    workdirs = [home + "/work", home + "/nope", "/etc", home + "/work/../../..",
                home + "/work\n[Unit]\nX=1", home + "/" + "w" * 4000]
    commands = [["sh", "-c", "touch " + home + "/work/RAN"], ["x\n[Service]\nExecStart=/bin/sh"],
                ["\x1b]0;evil\x07"]]
    reqs = []
    for wd in workdirs:
        for cmd in commands:
            for sandbox in ("", "none"):
                reqs.append({"command": Variant("as", cmd), "workdir": Variant("s", wd),
                             "sandbox": Variant("s", sandbox),
                             "env": Variant("a{ss}", {"LD_PRELOAD": "/tmp/x", "A\nB": "c"})})
    gate = asyncio.Semaphore(8)

    async def gated(req, attached):
        async with gate:
            return await one(bus, req, attached)

    results = await asyncio.gather(*(gated(req, n % 2 == 0)
                                     for _ in range(3) for n, req in enumerate(reqs)))
    refused = sum(1 for r in results if r == "org.leviath.Error.AccessDenied")
    print("refused", refused, "of", len(results), sorted(set(results)))

asyncio.run(main(sys.argv[1]))
"""


def test_a_refused_users_flood_of_odd_starts_leaves_nothing(bed: Testbed) -> None:
    """carol (polkit refuses her) sends 108 starts at once, Run and
    RunAttached, with odd workdirs (missing, /etc, a newline and a unit
    section, 4000 characters), commands and env: every one is
    refused (AccessDenied), nothing of hers ran, no scope of hers is left,
    and the journal holds nothing because of her but the daemon's refusals.
    Seen failing before the fix: systemd's "Started/Stopped leviath-carol-
    ...scope" lines, one pair per start polkit then refused (scopes were
    started beside polkit's question for every caller)."""
    home = bed.users["carol"].home
    bed.run(["rm", "-f", f"{home}/work/RAN"])
    bed.write_file("/tmp/refused.py", REFUSED)
    pid = _daemon_pid(bed)
    since = bed.run(["date", "+@%s.%N"]).stdout.strip()
    out = bed.run([VENV_PY, "/tmp/refused.py", home], user="carol", timeout=300).stdout
    n = int(out.split()[3])
    assert out.split()[1] == str(n) and n == 108, out
    time.sleep(1)
    assert _daemon_pid(bed) == pid
    assert bed.run(["test", "-e", f"{home}/work/RAN"], check=False).returncode != 0
    units = bed.run(["systemctl", "list-units", "--all", "--no-legend", "--plain",
                     "leviath-*"], check=False).stdout
    assert "carol" not in units, units
    logged = bed.run(["journalctl", "--no-pager", "-q", "-o", "json", "--since", since],
                     check=False).stdout
    ours = [json.loads(x) for x in logged.splitlines()]
    # The daemon's own "refused" line (info, one per call) is older than
    # issue 18 and not counted; a warning, or anything about a scope, is.
    ours = [e for e in ours if "carol" in str(e.get("MESSAGE", "")) or (
        (e.get("SYSLOG_IDENTIFIER") == "leviathd"
         or e.get("_SYSTEMD_UNIT") == "leviathd.service")
        and (int(e.get("PRIORITY", 6)) <= 4 or "refused" not in str(e.get("MESSAGE"))))]
    assert not ours, [e.get("MESSAGE") for e in ours][:10]
    rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="dave").stdout)
    assert not [r for r in rows if r.get("user") == "carol"], rows


INSIDE = (
    "cat /proc/self/mountinfo > mounts.out; "
    "ls -l /proc/self/fd/ > fds.out 2>&1; ls -l /proc/1/fd/ > pid1fds.out 2>&1; "
    "ls -l /proc/self/ns/ > ns.out 2>&1; "
    "cat /proc/1/fd/7 >> pid1fds.out 2>&1; "
    "touch /usr/local/red-sub/x 2> write.out; echo $? >> write.out; "
    "sleep 3; cat /proc/self/mountinfo > mounts-later.out"
)


def test_inside_a_fence_no_writable_suid_or_dev_mount_hides_beneath_a_read_only_bind(
    bed: Testbed,
) -> None:
    """The host has a rw, suid, dev tmpfs under /usr (bound read-only into
    the fence): inside, that mount is read-only, nosuid and nodev too, and
    every mount beneath /usr is; a mount the host makes after the start does
    not appear inside; neither the command nor PID 1 (as far as it can look)
    holds a namespace descriptor, and its namespaces are not the host's.
    Passed before (the recursive mount_setattr lock and the fork into the
    step's namespaces hold)."""
    bed.run("mkdir -p /usr/local/red-sub /usr/local/red-late && (mountpoint -q "
            "/usr/local/red-sub || mount -t tmpfs -o rw,suid,dev red /usr/local/red-sub)")
    # The daemon's mount namespace is made at its start (the bed's / is private).
    bed.run(["systemctl", "restart", "leviathd"])
    home = bed.users["alice"].home
    work = f"{home}/work"
    bed.run(["sh", "-c", "rm -f *.out"], user="alice", cwd=work)
    proc = subprocess.Popen(bed.command(["lev", "run", "--workdir", work, "--", "sh", "-c", INSIDE],
                                        user="alice"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(1.5)
        bed.run("mountpoint -q /usr/local/red-late || "
                "mount -t tmpfs -o rw,suid,dev late /usr/local/red-late")
        proc.communicate(timeout=60)
        read = lambda name: bed.run(["cat", f"{work}/{name}"], user="alice").stdout  # noqa: E731
        mounts = [ln.split() for ln in read("mounts.out").splitlines()]
        under_usr = [m for m in mounts if m[4] == "/usr" or m[4].startswith("/usr/")]
        assert any(m[4] == "/usr/local/red-sub" for m in under_usr), under_usr
        for m in under_usr:
            opts = m[5].split(",")
            assert "ro" in opts and "nosuid" in opts and "nodev" in opts, m
        assert read("write.out").split()[-1] != "0"
        later = read("mounts-later.out")
        assert "/usr/local/red-late" not in later and "master:" not in later, later
        # PID 1 keeps the output pipes (6, 7) a restarted daemon takes back:
        # the agent cannot reach its descriptors to put others there.
        assert "Permission denied" in read("pid1fds.out"), read("pid1fds.out")
        for name in ("fds.out", "pid1fds.out"):
            assert "ns:[" not in read(name) and "pidfd" not in read(name), read(name)
        host_ns = bed.run("ls -l /proc/1/ns/").stdout
        inside = read("ns.out")
        for kind in ("pid", "mnt", "ipc", "uts"):  # net: shared by default (network = true)
            mine = next(ln.split("->")[1].strip() for ln in inside.splitlines()
                        if f" {kind} ->" in ln)
            assert mine not in host_ns, (kind, mine)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        bed.run("umount /usr/local/red-late /usr/local/red-sub; rmdir /usr/local/red-late "
                "/usr/local/red-sub", check=False)


def test_attached_agents_past_the_copy_budget_all_run_and_the_daemon_keeps_its_files(
    bed: Testbed,
) -> None:
    """With a small file limit (budget: 2 copies), 12 attached agents at
    once from alice: each one's output reaches its `lev run`, each ends
    with its status, the daemon stays up and gives its descriptors back."""
    bed.write_file("/etc/systemd/system/leviathd.service.d/red-nofile.conf",
                   "[Service]\nLimitNOFILE=192\n")
    bed.run(["systemctl", "daemon-reload"])
    bed.run(["systemctl", "restart", "leviathd"])
    try:
        pid = _daemon_pid(bed)
        before = _daemon_fds(bed)
        work = f"{bed.users['alice'].home}/work"
        procs = [subprocess.Popen(
            bed.command(["lev", "run", "--workdir", work, "--", "sh", "-c",
                         f"echo budget-{n}; sleep 2; echo budget-end-{n} >&2; exit {n}"],
                        user="alice"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE) for n in range(12)]
        for n, proc in enumerate(procs):
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == n, (n, out, err)
            assert f"budget-{n}".encode() in out and f"budget-end-{n}".encode() in err, (out, err)
        assert _daemon_pid(bed) == pid
        assert _settle_fds(bed, before) <= before + 2
    finally:
        bed.run(["rm", "-f", "/etc/systemd/system/leviathd.service.d/red-nofile.conf"])
        bed.run(["systemctl", "daemon-reload"])
        bed.run(["systemctl", "restart", "leviathd"])


def test_a_client_killed_mid_run_costs_the_agent_nothing(bed: Testbed) -> None:
    """alice's `lev run` is SIGKILLed while its agent floods output: the
    agent goes on to its end (status kept), its last line reaches the
    journal, the daemon stays up, its memory stays bounded and its
    descriptors come back. Passed before (guard)."""
    pid = _daemon_pid(bed)
    before = _daemon_fds(bed)
    rss0 = int(bed.run(["ps", "-o", "rss=", "-p", pid]).stdout)
    home = bed.users["alice"].home
    script = ("i=0; while [ $i -lt 40 ]; do head -c 500000 /dev/zero | tr '\\0' k; sleep 0.15; "
              "i=$((i+1)); done; echo flood-last-line; exit 6")
    proc = subprocess.Popen(
        bed.command(["sh", "-c", f'echo $$ > {home}/work/levpid2; exec lev run --workdir '
                     f'{home}/work -- sh -c "$0"', script], user="alice"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2)
        lev = bed.read_file(f"{home}/work/levpid2").strip()
        bed.run(["kill", "-KILL", lev], user="alice")
        proc.wait(timeout=30)
        deadline = time.monotonic() + 90
        row: dict = {}
        while time.monotonic() < deadline:
            rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="alice").stdout)
            row = next((r for r in rows if r["command"] == ["sh", "-c", script]), {})
            if row and row["state"] != "running":
                break
            time.sleep(0.5)
        assert row.get("state") == "exited" and row.get("exit_status") == 6, row
        logs = ""
        while "flood-last-line" not in logs and time.monotonic() < deadline:
            logs = bed.run(["lev", "logs", row["id"]], user="alice").stdout
            time.sleep(0.5)
        assert "flood-last-line" in logs
        assert _daemon_pid(bed) == pid
        rss1 = int(bed.run(["ps", "-o", "rss=", "-p", pid]).stdout)
        assert rss1 - rss0 < 30_000, (rss0, rss1)  # KiB: 20 MB went through
        assert _settle_fds(bed, before) <= before + 2
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
