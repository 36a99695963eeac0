"""Issue 18, per-agent processes, in the test bed: a detached namespace
agent keeps one process of ours (its PID 1, a sealed dash that records the
exit status) beside its command; no leviathd process stays per agent; PID 1
and the exit record it holds are out of the agent's (and its user's) reach;
its output still reaches the journal; its exit status outlives a daemon
killed with SIGKILL."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from journal_wait import journal_with
from testbed import Testbed

pytestmark = pytest.mark.testbed

CONFIG = '[sandbox]\nkind = "namespace"\n'


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.run(["mkdir", "-p", "work"], user="alice")
    yield testbed


def _start(bed: Testbed, *command: str) -> tuple[str, str]:
    home = bed.users["alice"].home
    agent_id = bed.run(["lev", "run", "--detach", "--workdir", f"{home}/work", "--", *command],
                       user="alice").stdout.strip()
    rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="alice").stdout)
    return agent_id, next(r["unit"] for r in rows if r["id"] == agent_id)


def _wait_ended(bed: Testbed, agent_id: str) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="alice").stdout)
        row = next((r for r in rows if r["id"] == agent_id), None)
        if row is not None and row["state"] != "running":
            return row
        time.sleep(0.3)
    raise AssertionError(f"agent {agent_id} still running")


def _scope_pids(bed: Testbed, unit: str) -> list[str]:
    found = bed.run(f"grep -l '{unit}' /proc/[0-9]*/cgroup", check=False).stdout.split()
    return [f.split("/")[2] for f in found]


def _settled_pids(bed: Testbed, unit: str) -> list[str]:
    """The scope's processes once the start is over: the held child may
    still be leaving just after `lev run --detach` returns, so the list is
    read until it holds the command and stays the same twice (10 s at most)."""
    deadline = time.monotonic() + 10
    last: list[str] = []
    while True:
        pids = sorted(p for p in _scope_pids(bed, unit) if _cmdline(bed, p))
        if pids == last and any(_cmdline(bed, p).startswith("sleep ") for p in pids):
            return pids
        if time.monotonic() > deadline:
            return pids
        last = pids
        time.sleep(0.3)


def _cmdline(bed: Testbed, pid: str) -> str:
    return bed.run(["cat", f"/proc/{pid}/cmdline"], check=False).stdout.replace("\0", " ")


def _leviathd_pids(bed: Testbed) -> set[str]:
    """Processes whose command line names leviathd (not this search's own)."""
    out = bed.run("grep -l leviathd /proc/[0-9]*/cmdline", check=False).stdout.split()
    pids = {f.split("/")[2] for f in out}
    return {p for p in pids if "/proc/" not in _cmdline(bed, p) and _cmdline(bed, p)}


def test_a_detached_agent_keeps_one_process_of_ours_and_no_leviathd_process(
    bed: Testbed,
) -> None:
    """Seen failing before the handover: 4 processes of ours per agent (the
    supervisor, its worker and the journal relay, all leviathd, and PID 1)."""
    before = _leviathd_pids(bed)
    started = [_start(bed, "sleep", "300") for _ in range(3)]
    try:
        for _agent_id, unit in started:
            pids = _settled_pids(bed, unit)
            ours = [p for p in pids if not _cmdline(bed, p).startswith("sleep ")]
            assert len(pids) == 2 and len(ours) == 1, [(p, _cmdline(bed, p)) for p in pids]
            (pid1,) = ours
            assert "leviathd" not in _cmdline(bed, pid1)
            rollup = bed.run(["cat", f"/proc/{pid1}/smaps_rollup"]).stdout
            pss = next(int(line.split()[1]) for line in rollup.splitlines()
                       if line.startswith("Pss:"))
            assert pss < 1024, rollup  # KiB: dash, not a Python interpreter
        assert _leviathd_pids(bed) - before == set()
    finally:
        for agent_id, _unit in started:
            bed.run(["lev", "stop", agent_id], user="alice", check=False)


def test_pid1_and_the_exit_record_it_holds_are_out_of_the_users_reach(bed: Testbed) -> None:
    agent_id, unit = _start(bed, "sleep", "300")
    try:
        pid1 = next(p for p in _settled_pids(bed, unit) if not _cmdline(bed, p).startswith("sleep"))
        assert bed.run(["stat", "-c", "%u", f"/proc/{pid1}"]).stdout.strip() == str(
            bed.users["alice"].uid)
        for probe in (f"ls /proc/{pid1}/fd", f"head -c1 /proc/{pid1}/environ",
                      f"cat /proc/{pid1}/maps", f"echo '{{\"exit_status\": 0}}' > "
                      f"/proc/{pid1}/fd/9"):
            r = bed.run(probe, user="alice", check=False)
            assert r.returncode != 0, (probe, r.stdout)
    finally:
        bed.run(["lev", "stop", agent_id], user="alice", check=False)


def test_inside_the_agent_pid1_cannot_be_reached_and_the_status_is_the_commands(
    bed: Testbed,
) -> None:
    script = ("ls /proc/1/fd >/dev/null 2>&1 && echo fd-open; "
              "(echo '{\"exit_status\": 0}' > /proc/1/fd/9) 2>/dev/null && echo wrote; "
              "kill -KILL 1; kill -TERM 1; sleep 0.2; echo still-here; exit 7")
    agent_id, _unit = _start(bed, "sh", "-c", script)
    row = _wait_ended(bed, agent_id)
    assert row["state"] == "exited" and row["exit_status"] == 7, row
    logs = bed.run(["lev", "logs", agent_id], user="alice").stdout
    assert "still-here" in logs and "fd-open" not in logs and "wrote" not in logs, logs


def test_a_short_agents_output_reaches_its_owners_journal_under_its_unit(bed: Testbed) -> None:
    agent_id, unit = _start(bed, "sh", "-c", "echo last-words-1; echo last-words-2 >&2")
    _wait_ended(bed, agent_id)
    deadline = time.monotonic() + 10
    entries: list[dict] = []
    while time.monotonic() < deadline:
        out = bed.run(["journalctl", "--no-pager", "-q", "-o", "json", "-u", unit],
                      user="alice", check=False).stdout
        entries = [json.loads(x) for x in out.splitlines()]
        if {"last-words-1", "last-words-2"} <= {e.get("MESSAGE") for e in entries}:
            break
        time.sleep(0.3)
    got = {e.get("MESSAGE"): e for e in entries}
    assert got["last-words-1"]["PRIORITY"] == "6" and got["last-words-2"]["PRIORITY"] == "4"
    assert got["last-words-1"]["_UID"] == str(bed.users["alice"].uid)
    logs = bed.run(["lev", "logs", agent_id], user="alice").stdout
    assert "last-words-1" in logs and "last-words-2" in logs


def test_the_exit_status_outlives_a_daemon_killed_while_the_agent_runs(bed: Testbed) -> None:
    """The agent ends after the restart as well as during the outage."""
    during, _ = _start(bed, "sh", "-c", "sleep 2; exit 3")
    after, _ = _start(bed, "sh", "-c", "sleep 6; exit 4")
    bed.run(["systemctl", "kill", "--signal=SIGKILL", "leviathd"])
    time.sleep(3)
    bed.run(["systemctl", "restart", "leviathd"])
    assert _wait_ended(bed, during)["exit_status"] == 3
    row = _wait_ended(bed, after)
    assert row["state"] == "exited" and row["exit_status"] == 4, row


def test_lev_stop_leaves_the_signal_status(bed: Testbed) -> None:
    agent_id, unit = _start(bed, "sleep", "300")
    deadline = time.monotonic() + 30
    while not any(_cmdline(bed, p).startswith("sleep") for p in _scope_pids(bed, unit)):
        assert time.monotonic() < deadline, "the command never ran"
        time.sleep(0.1)
    bed.run(["lev", "stop", agent_id], user="alice")
    row = _wait_ended(bed, agent_id)
    assert row["state"] == "stopped" and row["exit_status"] == 128 + 15, row


def test_the_users_path_cannot_put_her_program_in_pid1s_place(bed: Testbed) -> None:
    """dash looks for builtins where `%builtin` sits in PATH: with it last,
    a `printf` of hers would run with the exit record open. Seen failing
    before PID 1 reset PATH (the record said 0, forged). And the command is
    the one in PATH, not a dash builtin of that name."""
    home = bed.users["alice"].home
    bed.run(["mkdir", "-p", f"{home}/work/bin"], user="alice")
    bed.run(f"cat > {home}/work/bin/printf && chmod +x {home}/work/bin/printf", user="alice",
            input="#!/bin/sh\necho '{\"exit_status\": 0}' >&9\n")
    path = f"{home}/work/bin:%builtin:/usr/local/bin:/usr/bin:/bin"
    agent_id = bed.run(["env", f"PATH={path}", "lev", "run", "--detach", "--workdir",
                        f"{home}/work", "--", "sh", "-c", "exit 5"], user="alice").stdout.strip()
    row = _wait_ended(bed, agent_id)
    assert row["state"] == "exited" and row["exit_status"] == 5, row
    echo_id, _unit = _start(bed, "echo", "-e", "plain\\tcoreutils")
    _wait_ended(bed, echo_id)
    logs = bed.run(["lev", "logs", echo_id], user="alice").stdout
    assert "plain\tcoreutils" in logs and "-e" not in logs, logs


def test_a_daemon_killed_before_it_heard_pid1_finds_it_again(bed: Testbed) -> None:
    """The daemon died between releasing the agent and hearing its PID 1's
    pid: the record still names the held process, which is gone. Simulated
    by naming another process there. Seen failing before the restarted
    daemon looked for PID 1 in the scope: the running agent was `failed`."""
    # Ends when the test says so, not after a time the loaded machine may
    # spend on the restart alone (it is asserted running after it).
    go = f"{bed.users['alice'].home}/work/go-refound"
    bed.run(["rm", "-f", go], user="alice")
    agent_id, _unit = _start(bed, "sh", "-c", "until [ -e go-refound ]; do sleep 0.2; done; exit 6")
    record = f"/var/lib/leviath/agents/{agent_id}.json"
    # The daemon writes the record again when it hears PID 1's pid, which on
    # a loaded machine can come after the edit (a whole-suite run beside a
    # soak read its pid back here once): edited until the edit stays.
    deadline = time.monotonic() + 30
    while True:
        bed.run(["sed", "-i", 's/"supervisor_pid":[0-9]*/"supervisor_pid":1/', record])
        time.sleep(1)
        if '"supervisor_pid":1,' in bed.run(["cat", record]).stdout:
            break
        assert time.monotonic() < deadline, bed.run(["cat", record]).stdout
    bed.run(["systemctl", "kill", "--signal=SIGKILL", "leviathd"])
    time.sleep(1)
    bed.run(["systemctl", "restart", "leviathd"])
    # Looked at until it reads running, with a bound: on a loaded machine
    # the restarted daemon may still be adopting (a whole-suite run beside a
    # soak failed here once); `failed`, what the fix is about, never turns
    # back into running.
    deadline = time.monotonic() + 60
    while True:
        rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="alice").stdout)
        mine = [r for r in rows if r["id"] == agent_id]
        if mine and mine[0]["state"] in ("running", "failed", "exited"):
            break
        assert time.monotonic() < deadline, mine
        time.sleep(0.5)
    assert mine[0]["state"] == "running", (mine, bed.run(
        "journalctl -u leviathd --no-pager -o cat | tail -20", check=False).stdout)
    bed.run(["touch", go], user="alice")
    row = _wait_ended(bed, agent_id)
    assert row["state"] == "exited" and row["exit_status"] == 6, row


def test_a_proxied_agent_keeps_only_pid1_and_its_proxy_works_across_a_restart(
    bed: Testbed,
) -> None:
    """network = "proxy": PID 1 keeps the listening socket and the daemon
    accepts on it (again after a SIGKILL and restart); no supervisor, no
    relay. Seen failing before the handover took proxied agents (5
    processes of ours: supervisor, worker, journal relay, PID 1, relay),
    and with the untied relay (2)."""
    bed.write_file("/etc/leviath/config.toml", CONFIG + 'network = "proxy"\n')
    bed.run(["systemctl", "restart", "leviathd"])
    before = _leviathd_pids(bed)
    probe = "curl -s -o /dev/null -w 'code=%{http_code}\\n' http://denied.invalid/"
    try:
        script = (f"echo proxy=$http_proxy; echo fds: $(ls /proc/$$/fd/); {probe}; "
                  f"sleep 4; {probe}; exec sleep 300")
        agent_id, unit = _start(bed, "sh", "-c", script)
        deadline = time.monotonic() + 30
        while not any(_cmdline(bed, p).startswith("sleep 4") for p in _scope_pids(bed, unit)):
            assert time.monotonic() < deadline, "the command never ran"
            time.sleep(0.1)
        pids = _scope_pids(bed, unit)
        # Ours: outside the agent's PID namespace (NSpid of one level), or its PID 1.
        nspid = {p: bed.run(f"grep NSpid /proc/{p}/status", check=False).stdout.split()[1:]
                 for p in pids}
        ours = [p for p in pids if len(nspid[p]) < 2 or nspid[p][-1] == "1"]
        assert len(ours) == 1, [(p, nspid[p], _cmdline(bed, p)) for p in pids]
        assert "leviathd" not in _cmdline(bed, ours[0])
        assert _leviathd_pids(bed) - before == set()
        # PID 1's socket is out of the agent's user's reach, as its record is.
        r = bed.run(["ls", f"/proc/{ours[0]}/fd"], user="alice", check=False)
        assert r.returncode != 0
        bed.run(["systemctl", "kill", "--signal=SIGKILL", "leviathd"])
        bed.run(["systemctl", "restart", "leviathd"])
        deadline = time.monotonic() + 20
        logs = ""
        while logs.count("code=") < 2 and time.monotonic() < deadline:
            time.sleep(0.3)
            logs = bed.run(["lev", "logs", agent_id], user="alice").stdout
        # The daemon's proxy answered both (it refuses the name): no 000,
        # which is curl's word for a connection nobody took.
        assert "proxy=http://127.0.0.1:3128" in logs, logs
        assert logs.count("code=") == 2 and "code=000" not in logs, logs
        # The command does not get PID 1's descriptors (8: the socket, 9: the record).
        fds = next(line for line in logs.splitlines() if line.startswith("fds:")).split()
        assert fds[:4] == ["fds:", "0", "1", "2"] and "8" not in fds and "9" not in fds, logs
        bed.run(["lev", "stop", agent_id], user="alice")
        row = _wait_ended(bed, agent_id)
        assert row["state"] == "stopped" and row["exit_status"] == 128 + 15, row
    finally:
        bed.write_file("/etc/leviath/config.toml", CONFIG)
        bed.run(["systemctl", "restart", "leviathd"])


def test_supervised_agents_pid1s_run_one_shared_sealed_catatonit(bed: Testbed) -> None:
    """A seeded agent keeps its supervisor; its PID 1 runs the daemon's one
    sealed copy of catatonit (the same memfd for every agent) instead of a
    700 KB copy of its own. Seen failing before: one inode per agent."""
    home = bed.users["alice"].home
    bed.run(f"mkdir -p {home}/seeded && cat > {home}/seeded/blueprint.toml", user="alice",
            input='[agent]\nname = "seeded"\ncommand = ["sleep", "300"]\n'
                  '[seed]\ncommands = [["true"]]\n')
    clients = [subprocess.Popen(bed.command(
        ["lev", "run", "--workdir", f"{home}/work", f"{home}/seeded"], user="alice"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
    ids: list[str] = []
    try:
        deadline = time.monotonic() + 30
        pid1s: list[str] = []
        while time.monotonic() < deadline:
            rows = json.loads(bed.run(["lev", "ps", "--json"], user="alice").stdout)
            mine = [r for r in rows if r["command"] == ["sleep", "300"]]
            ids = [r["id"] for r in mine]
            pid1s = []
            for row in mine:
                for p in _scope_pids(bed, row["unit"]):
                    ns = bed.run(f"grep NSpid /proc/{p}/status", check=False).stdout.split()
                    if len(ns) > 2 and ns[-1] == "1":
                        pid1s.append(p)
            if len(pid1s) == 2:
                break
            time.sleep(0.3)
        assert len(pid1s) == 2, (ids, pid1s)
        exes = [bed.run(["stat", "-L", "-c", "%d:%i", f"/proc/{p}/exe"]).stdout.strip()
                for p in pid1s]
        names = [bed.run(["readlink", f"/proc/{p}/exe"]).stdout for p in pid1s]
        assert all("memfd:leviath-init" in n for n in names), names
        assert exes[0] == exes[1], exes
    finally:
        for agent_id in ids:
            bed.run(["lev", "stop", agent_id], user="alice", check=False)
        for client in clients:
            client.kill()
            client.wait()


def test_an_attached_agents_pid1_is_the_supervisors_own_child_and_holds_no_namespace(
    bed: Testbed,
) -> None:
    """A supervised (here seeded; attached one-command agents have none
    now) namespace agent: its PID 1 is forked by the supervisor
    itself, which entered the step's namespaces for that one fork (no worker
    process between them: a fork and an exit of a daemon-sized process fewer
    per start, issue 18). PID 1 keeps none of the descriptors the supervisor
    holds to come back to its own namespaces (the host's network and PID
    namespaces, in the agent's hands). Seen failing before: PID 1's parent
    was a worker, a fork of the supervisor."""
    home = bed.users["alice"].home
    bed.run(f"mkdir -p {home}/seeded301 && cat > {home}/seeded301/blueprint.toml",
            user="alice", input='[agent]\nname = "seeded"\ncommand = ["sleep", "301"]\n'
                                '[seed]\ncommands = [["true"]]\n')
    client = subprocess.Popen(bed.command(
        ["lev", "run", "--workdir", f"{home}/work", f"{home}/seeded301"], user="alice"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    agent_id = ""
    try:
        deadline = time.monotonic() + 30
        pid1 = ""
        while time.monotonic() < deadline and not pid1:
            rows = json.loads(bed.run(["lev", "ps", "--json"], user="alice").stdout)
            row = next((r for r in rows if r["command"] == ["sleep", "301"]), None)
            if row is not None:
                agent_id = row["id"]
                for p in _scope_pids(bed, row["unit"]):
                    ns = bed.run(f"grep NSpid /proc/{p}/status", check=False).stdout.split()
                    if len(ns) > 2 and ns[-1] == "1":
                        pid1 = p
            time.sleep(0.2)
        assert pid1, agent_id
        ppid = bed.run(["ps", "-o", "ppid=", "-p", pid1]).stdout.strip()
        parent_exe = bed.run(["readlink", f"/proc/{ppid}/exe"]).stdout
        parent_of_parent = bed.run(["ps", "-o", "ppid=", "-p", ppid]).stdout.strip()
        # The supervisor's parent is the daemon (or, after a restart, PID 1
        # of the bed); a worker's would be the supervisor, in the same scope.
        assert parent_of_parent not in _scope_pids(bed, row["unit"]), (ppid, parent_exe)
        links = bed.run(f"ls -l /proc/{pid1}/fd/", check=False).stdout
        assert ":[" not in links.replace("socket:[", "").replace("pipe:[", "").replace(
            "anon_inode:[", ""), links
    finally:
        if agent_id:
            bed.run(["lev", "stop", agent_id], user="alice", check=False)
        client.kill()
        client.wait()


def _attached(bed: Testbed, script: str) -> tuple[subprocess.Popen[bytes], str, str]:
    """`lev run` (attached) of `sh -c script`, as alice; its agent's id and unit."""
    home = bed.users["alice"].home
    bed.run(["rm", "-f", f"{home}/work/levpid"], user="alice")
    shell = (f'echo $$ > {home}/work/levpid; exec lev run --workdir {home}/work -- '
             'sh -c "$0"')
    client = subprocess.Popen(bed.command(["sh", "-c", shell, script], user="alice"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="alice").stdout)
        mine = [r for r in rows if r["command"] == ["sh", "-c", script]]
        if mine:
            return client, mine[0]["id"], mine[0]["unit"]
        time.sleep(0.2)
    client.kill()
    raise AssertionError("the attached agent did not start")


def _killed_restarted_ended(
    bed: Testbed, client: subprocess.Popen[bytes], agent_id: str, last: str
) -> str:
    """SIGKILL and restart the daemon, let the agent go on (its `restarted`
    file), and wait for its end: the record and `lev run` say status 5; its
    logs, once `last` is in them (10 s at most)."""
    bed.run(["systemctl", "kill", "--signal=SIGKILL", "leviathd"])
    bed.run(["systemctl", "restart", "leviathd"])
    bed.run(["touch", f"{bed.users['alice'].home}/work/restarted"], user="alice")
    row = _wait_ended(bed, agent_id)
    assert row["state"] == "exited" and row["exit_status"] == 5, row
    assert client.wait(timeout=30) == 5
    deadline = time.monotonic() + 10
    logs = ""
    while last not in logs and time.monotonic() < deadline:
        logs = bed.run(["lev", "logs", agent_id], user="alice").stdout
        time.sleep(0.3)
    return logs


def _read_until(pipe: Any, marker: bytes, timeout: float = 20) -> bytes:
    got = b""
    deadline = time.monotonic() + timeout
    while marker not in got and time.monotonic() < deadline:
        if select.select([pipe], [], [], 0.2)[0]:
            chunk = os.read(pipe.fileno(), 65536)
            if not chunk:
                break
            got += chunk
    return got


def test_an_attached_agent_keeps_one_process_of_ours_and_its_output_reaches_both(
    bed: Testbed,
) -> None:
    """Seen failing before the daemon copied attached output: 4 processes of
    ours (the supervisor, its worker and the journal relay, all leviathd,
    and PID 1)."""
    before = _leviathd_pids(bed)
    script = ("echo fds: $(ls /proc/$$/fd/); echo attached-out; echo attached-err >&2; "
              "exec sleep 300")
    client, agent_id, unit = _attached(bed, script)
    try:
        got = _read_until(client.stdout, b"attached-out")
        assert b"attached-out" in got, got
        # PID 1 keeps the pipes' read ends (6, 7) and the record (9), not the command.
        fds = next(ln for ln in got.decode().splitlines() if ln.startswith("fds:")).split()
        assert fds[:4] == ["fds:", "0", "1", "2"] and not {"6", "7", "9"} & set(fds), fds
        assert b"attached-err" in _read_until(client.stderr, b"attached-err")
        pids = _settled_pids(bed, unit)
        ours = [p for p in pids if not _cmdline(bed, p).startswith("sleep ")]
        assert len(pids) == 2 and len(ours) == 1, [(p, _cmdline(bed, p)) for p in pids]
        rollup = bed.run(["cat", f"/proc/{ours[0]}/smaps_rollup"]).stdout
        pss = next(int(line.split()[1]) for line in rollup.splitlines()
                   if line.startswith("Pss:"))
        assert pss < 1024, rollup
        assert _leviathd_pids(bed) - before == set()
        # Ctrl-C in lev stops the agent; lev exits with the signal's status.
        levpid = bed.read_file(f"{bed.users['alice'].home}/work/levpid").strip()
        bed.run(["kill", "-INT", levpid], user="alice")
        assert client.wait(timeout=30) == 128 + 15
        row = _wait_ended(bed, agent_id)
        assert row["state"] == "stopped" and row["exit_status"] == 128 + 15, row
        out = journal_with(bed, ["-o", "json", "-u", unit], '"attached-out"',
                           '"attached-err"', user="alice")
        got = {e.get("MESSAGE"): e for e in map(json.loads, out.splitlines())}
        assert got["attached-out"]["_UID"] == str(bed.users["alice"].uid), got
        assert got["attached-out"]["PRIORITY"] == "6" and got["attached-err"]["PRIORITY"] == "4"
    finally:
        bed.run(["lev", "stop", agent_id], user="alice", check=False)
        client.kill()
        client.wait()


def test_an_attached_agents_output_and_status_outlive_a_daemon_restart(bed: Testbed) -> None:
    """The daemon is SIGKILLed while the attached agent runs: what the agent
    writes afterwards still reaches its journal (the new daemon takes the
    pipes back from PID 1), its last words too, and `lev run` ends with its
    status. Seen failing without the new daemon taking the pipes back: the
    agent waited on its full pipe for good (still running)."""
    # The agent writes once the new daemon runs, and lingers a moment after
    # its last words: that output read after PID 1's end is journaled too is
    # the test below's.
    script = ("echo before-restart; while [ ! -e restarted ]; do sleep 0.1; done; "
              "echo after-restart; head -c 300000 /dev/zero | tr '\\0' y | fold -w 500; "
              "echo last-words; sleep 2; exit 5")
    bed.run(["rm", "-f", f"{bed.users['alice'].home}/work/restarted"], user="alice")
    client, agent_id, _unit = _attached(bed, script)
    try:
        assert b"before-restart" in _read_until(client.stdout, b"before-restart")
        logs = _killed_restarted_ended(bed, client, agent_id, "last-words")
        assert "before-restart" in logs and "after-restart" in logs, logs[-500:]
        assert logs.count("y") == 300000 and "last-words" in logs, logs[-500:]
    finally:
        bed.run(["lev", "stop", agent_id], user="alice", check=False)
        client.kill()
        client.wait()


def _journaled(bed: Testbed, unit: str, last: set[str]) -> list[dict[str, str]]:
    """The unit's journal entries once every line of `last` is in them (10 s at most)."""
    deadline = time.monotonic() + 10
    entries: list[dict[str, str]] = []
    while time.monotonic() < deadline:
        out = bed.run(["journalctl", "--no-pager", "-q", "-o", "json", "-u", unit],
                      check=False).stdout
        entries = [json.loads(x) for x in out.splitlines()]
        if last <= {e.get("MESSAGE", "") for e in entries}:
            break
        time.sleep(0.3)
    return entries


def _daemon_zombies(bed: Testbed) -> list[str]:
    main = bed.run(["systemctl", "show", "-p", "MainPID", "--value", "leviathd"]).stdout.strip()
    kids = bed.run(f"grep -lE '^PPid:\\s+{main}$' /proc/[0-9]*/status", check=False).stdout
    return [f for f in kids.split()
            if "\tZ" in bed.run(["grep", "^State:", f], check=False).stdout]


def _last_output_after_restart(bed: Testbed, linger: str = "") -> float:
    """After `systemctl restart leviathd`, an attached agent writes ~60 KB
    to each stream, a marker line, and exits at once, while the new daemon
    lags behind (SIGSTOPped until the agent's command and PID 1 are gone,
    PID 1 reaped by systemd): every byte and both markers still reach its
    journal, under its unit and as its owner's, and the daemon keeps no
    zombie afterwards. `linger`: run first in the agent (`sleep 300 &`
    holds both pipes open). Returns the seconds from the daemon's SIGCONT to
    the agent's recorded end."""
    # One printf per stream, whole in the pipe's buffer (64 KiB).
    script = ("echo before-restart; while [ ! -e restarted ]; do sleep 0.1; done; " + linger
              + "s=$(head -c 60000 /dev/zero | tr '\\0' z | fold -w 500); "
              "printf '%s\\nTAIL-OUT\\n' \"$s\"; "
              "printf '%s\\nTAIL-ERR\\n' \"$(echo \"$s\" | tr z e)\" >&2; exit 5")
    home = bed.users["alice"].home
    bed.run(["rm", "-f", f"{home}/work/restarted"], user="alice")
    client, agent_id, unit = _attached(bed, script)
    stopped = False
    try:
        assert b"before-restart" in _read_until(client.stdout, b"before-restart")
        bed.run(["systemctl", "restart", "leviathd"])
        assert agent_id in bed.run(["lev", "ps"], user="alice").stdout
        bed.run(["systemctl", "kill", "--kill-whom=main", "--signal=SIGSTOP", "leviathd"])
        stopped = True
        bed.run(["touch", f"{home}/work/restarted"], user="alice")
        deadline = time.monotonic() + 20
        while any(c and not c.startswith("sleep 300")
                  for c in (_cmdline(bed, p) for p in _scope_pids(bed, unit))):
            assert time.monotonic() < deadline, "the agent did not end"
            time.sleep(0.2)
        time.sleep(0.5)
        bed.run(["systemctl", "kill", "--kill-whom=main", "--signal=SIGCONT", "leviathd"])
        stopped = False
        t0 = time.monotonic()
        # The daemon answers while it drains the pipes.
        bed.run(["lev", "ps"], user="alice", timeout=5)
        row = _wait_ended(bed, agent_id)
        took = time.monotonic() - t0
        assert row["state"] == "exited" and row["exit_status"] == 5, row
        assert client.wait(timeout=30) == 5
        entries = _journaled(bed, unit, {"TAIL-OUT", "TAIL-ERR"})
        got = {e.get("MESSAGE", ""): e for e in entries}
        messages = [e["MESSAGE"] for e in entries if isinstance(e.get("MESSAGE"), str)]
        counts = [sum(len(m) for m in messages if m and set(m) == {c}) for c in "ze"]
        assert "TAIL-OUT" in got and "TAIL-ERR" in got, (counts, messages[-3:])
        assert counts == [60000, 60000], counts
        uid = str(bed.users["alice"].uid)
        for marker, priority in (("TAIL-OUT", "6"), ("TAIL-ERR", "4")):
            entry = got[marker]
            assert entry["_SYSTEMD_UNIT"] == unit and entry["_UID"] == uid, entry
            assert entry["PRIORITY"] == priority, entry
        deadline = time.monotonic() + 5
        while _daemon_zombies(bed) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _daemon_zombies(bed) == []
        return took
    finally:
        if stopped:
            bed.run(["systemctl", "kill", "--kill-whom=main", "--signal=SIGCONT", "leviathd"])
        bed.run(["lev", "stop", agent_id], user="alice", check=False)
        client.kill()
        client.wait()


def test_an_attached_agents_last_output_after_a_restart_is_journaled_whole(
    bed: Testbed,
) -> None:
    """Seen failing before the restarted daemon kept a process of its own in
    the agent's scope to speak for the last lines: with PID 1 reaped, the
    daemon read the pipes to their end but had no pid to send the lines as,
    and dropped them (0 of 60,000 bytes and neither marker journaled)."""
    _last_output_after_restart(bed)


def test_a_process_left_holding_the_pipes_cannot_hold_the_restarted_daemon(
    kind_none: Testbed,
) -> None:
    """Kind none (no PID namespace, so a process the agent leaves behind
    outlives PID 1): `sleep 300 &` keeps both pipes open, so they never end.
    The restarted daemon still journals the last output whole, answers
    meanwhile, and records the end once its drain gives up (10 s), not
    after the sleep."""
    took = _last_output_after_restart(kind_none, linger="sleep 300 & ")
    # Recorded after the drain gave up (10 s), not after the sleep (300 s):
    # the bound sits between the two, far from either on a loaded machine.
    assert took < 150, took


def test_a_supervised_agent_ends_on_its_supervisors_word_with_all_output_and_no_zombie(
    bed: Testbed,
) -> None:
    """Written when kind none kept a supervisor, which says ENDED once the
    exit record is written and the output copied (issue 18); kind none is
    now handed over like a namespace agent (the daemon copies the output),
    and the promises stay: every line and the status reach `lev run`, the
    record and the journal, and no zombie is left."""
    home = bed.users["alice"].home
    bed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "none"\n')
    bed.run(["systemctl", "reload", "leviathd"])
    try:
        for status in (0, 3):
            lines = " ".join(f"line{i}" for i in range(200))
            r = bed.run(["lev", "run", "--workdir", f"{home}/work", "--", "sh", "-c",
                         f"for l in {lines}; do echo out-$l; done; echo last-err >&2; "
                         f"exit {status}"], user="alice", check=False)  # fmt: skip
            assert r.returncode == status, (r.stdout[-300:], r.stderr[-300:])
            assert r.stdout.splitlines() == [f"out-line{i}" for i in range(200)], r.stdout[-300:]
            assert "last-err" in r.stderr
        rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="alice").stdout)
        last = max(rows, key=lambda r: float(r.get("started_at", 0)))
        assert last["state"] == "exited" and last["exit_status"] == 3, last
        main = bed.run(["systemctl", "show", "-p", "MainPID", "--value", "leviathd"]).stdout.strip()
        deadline = time.monotonic() + 10
        while True:
            states = bed.run(["ps", "--ppid", main, "-o", "stat="], check=False).stdout.split()
            if not any(s.startswith("Z") for s in states) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert not any(s.startswith("Z") for s in states), states
    finally:
        bed.write_file("/etc/leviath/config.toml", CONFIG)
        bed.run(["systemctl", "reload", "leviathd"])


@pytest.fixture
def kind_none(bed: Testbed) -> Iterator[Testbed]:
    bed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "none"\n')
    bed.run(["systemctl", "reload", "leviathd"])
    try:
        yield bed
    finally:
        bed.write_file("/etc/leviath/config.toml", CONFIG)
        bed.run(["systemctl", "reload", "leviathd"])


def _lone_recorder(bed: Testbed, unit: str) -> str:
    """The one process of ours beside the command: dash from our memfd, as
    the user, not dumpable (her probes of it fail)."""
    pids = _settled_pids(bed, unit)
    ours = [p for p in pids if not _cmdline(bed, p).startswith("sleep ")]
    assert len(pids) == 2 and len(ours) == 1, [(p, _cmdline(bed, p)) for p in pids]
    (rec,) = ours
    assert bed.run(["readlink", f"/proc/{rec}/exe"]).stdout.startswith("/memfd:leviath-init")
    rollup = bed.run(["cat", f"/proc/{rec}/smaps_rollup"]).stdout
    assert next(int(ln.split()[1]) for ln in rollup.splitlines() if ln.startswith("Pss:")) < 1024
    assert bed.run(["stat", "-c", "%u", f"/proc/{rec}"]).stdout.strip() == str(
        bed.users["alice"].uid)
    for probe in (f"ls /proc/{rec}/fd", f"head -c1 /proc/{rec}/environ", f"cat /proc/{rec}/maps",
                  f"echo '{{\"exit_status\": 0}}' > /proc/{rec}/fd/9",
                  f"gdb -batch -p {rec} 2>&1 | grep -q 'Attaching' && false"):
        r = bed.run(probe, user="alice", check=False)
        assert r.returncode != 0, (probe, r.stdout)
    return rec


def test_a_detached_kind_none_agent_keeps_one_process_of_ours_across_a_restart(
    kind_none: Testbed,
) -> None:
    """Seen failing before kind none was handed over: 3 processes (the
    supervisor, the journal relay and the command). The output lands in
    the owner's journal under the scope; the status (and 128+N for a
    signal) outlives `systemctl restart leviathd`; her PATH cannot put a
    `printf` of hers in the recorder's place."""
    bed = kind_none
    before = _leviathd_pids(bed)
    agent_id, unit = _start(bed, "sh", "-c", "echo none-out; echo none-err >&2; exec sleep 300")
    try:
        _lone_recorder(bed, unit)
        assert _leviathd_pids(bed) - before == set()
        bed.run(["systemctl", "restart", "leviathd"])
        bed.run(["lev", "stop", agent_id], user="alice")
        row = _wait_ended(bed, agent_id)
        assert row["state"] == "stopped" and row["exit_status"] == 128 + 15, row
        out = journal_with(bed, ["-o", "json", "-u", unit], '"none-out"', '"none-err"',
                           user="alice")
        got = {e.get("MESSAGE"): e for e in map(json.loads, out.splitlines())}
        assert got["none-out"]["_UID"] == str(bed.users["alice"].uid), got
        assert got["none-out"]["PRIORITY"] == "6" and got["none-err"]["PRIORITY"] == "4"
    finally:
        bed.run(["lev", "stop", agent_id], user="alice", check=False)
    # Killed before it heard the recorder's pid (simulated as in
    # test_a_daemon_killed_before_it_heard_pid1_finds_it_again): the new
    # daemon finds the recorder in the scope.
    # Ends when the test says so (a `sleep 6` had ended during the restart
    # on a loaded machine, and the agent was asserted running after it).
    go = f"{bed.users['alice'].home}/work/go-later"
    bed.run(["rm", "-f", go], user="alice")
    later, _unit = _start(bed, "sh", "-c", "until [ -e go-later ]; do sleep 0.2; done; exit 6")
    record = f"/var/lib/leviath/agents/{later}.json"
    bed.run(["sed", "-i", 's/"supervisor_pid":[0-9]*/"supervisor_pid":1/', record])
    bed.run(["systemctl", "kill", "--signal=SIGKILL", "leviathd"])
    bed.run(["systemctl", "restart", "leviathd"])
    rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user="alice").stdout)
    assert next(r for r in rows if r["id"] == later)["state"] == "running", rows
    bed.run(["touch", go], user="alice")
    row = _wait_ended(bed, later)
    assert row["state"] == "exited" and row["exit_status"] == 6, row
    home = bed.users["alice"].home
    bed.run(["mkdir", "-p", f"{home}/work/bin"], user="alice")
    bed.run(f"cat > {home}/work/bin/printf && chmod +x {home}/work/bin/printf", user="alice",
            input="#!/bin/sh\necho '{\"exit_status\": 0}' >&9\n")
    path = f"{home}/work/bin:%builtin:/usr/local/bin:/usr/bin:/bin"
    forged = bed.run(["env", f"PATH={path}", "lev", "run", "--detach", "--workdir",
                      f"{home}/work", "--", "sh", "-c", "exit 5"], user="alice").stdout.strip()
    row = _wait_ended(bed, forged)
    assert row["state"] == "exited" and row["exit_status"] == 5, row


def test_an_attached_kind_none_agent_keeps_one_process_of_ours_across_a_restart(
    kind_none: Testbed,
) -> None:
    """Seen failing before kind none was handed over (the supervisor and its
    relay stayed). The daemon copies the output, also after a restart (it
    takes the pipes back from the recorder); `lev run` ends with the status."""
    bed = kind_none
    before = _leviathd_pids(bed)
    # After-restart output once the new daemon runs (see the namespace test).
    script = ("echo fds: $(ls /proc/$$/fd/); echo attached-out; "
              "while [ ! -e restarted ]; do sleep 0.1; done; "
              "echo after-restart; echo last-err >&2; sleep 2; exit 5")
    bed.run(["rm", "-f", f"{bed.users['alice'].home}/work/restarted"], user="alice")
    client, agent_id, unit = _attached(bed, script)
    try:
        got = _read_until(client.stdout, b"attached-out")
        fds = next(ln for ln in got.decode().splitlines() if ln.startswith("fds:")).split()
        assert fds[:4] == ["fds:", "0", "1", "2"] and not {"6", "7", "9"} & set(fds), fds
        pids = sorted(p for p in _scope_pids(bed, unit) if _cmdline(bed, p))
        ours = [p for p in pids if bed.run(["readlink", f"/proc/{p}/exe"], check=False)
                .stdout.startswith("/memfd:leviath-init")]
        assert len(ours) == 1 and all("leviathd" not in _cmdline(bed, p) for p in pids), [
            (p, _cmdline(bed, p)) for p in pids]
        assert _leviathd_pids(bed) - before == set()
        logs = _killed_restarted_ended(bed, client, agent_id, "last-err")
        assert "attached-out" in logs and "after-restart" in logs and "last-err" in logs, logs
    finally:
        bed.run(["lev", "stop", agent_id], user="alice", check=False)
        client.kill()
        client.wait()


def test_a_kind_none_agent_that_kills_its_recorder_ends_whole(kind_none: Testbed) -> None:
    """Unlike a namespace PID 1, the recorder of a kind-none agent is a
    process of the user's (uid, no namespace): her command can SIGKILL it.
    Then no status is recorded, and the agent ends with nothing of it left
    running in its scope."""
    bed = kind_none
    agent_id, unit = _start(bed, "sh", "-c", "kill -KILL $PPID; sleep 300")
    row = _wait_ended(bed, agent_id)
    assert row["state"] != "running" and row.get("exit_status") != 0, row
    deadline = time.monotonic() + 15
    while _scope_pids(bed, unit) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not _scope_pids(bed, unit), [(p, _cmdline(bed, p)) for p in _scope_pids(bed, unit)]
