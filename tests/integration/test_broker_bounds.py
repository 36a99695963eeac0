"""An agent's tool calls are bounded and charged to the agent (issue 9 §2, §4;
issue 20 §8), tried from inside a real agent in the test bed.

The abuse runs as Python inside the agent's namespace sandbox, speaking the
broker's JSON lines directly (as a hostile agent would, not through `lev
tool`). A root sampler in the bed reads the daemon's VmRSS every 50 ms; the
daemon may grow by less than 30 MB under the abuse and must come back to
within 10 MB of where it started."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator

import pytest
from loop_agent import LOOP
from testbed import Testbed

pytestmark = pytest.mark.testbed

MB = 1 << 20

BLUEPRINT = """
[agent]
name = "boundtest"
description = "abuses its broker"
command = ["sh", "loop.sh"]
"""


# Imported by every abuse script: raw JSON lines on the agent's socket.
CLIENT = r"""
import json, os, socket

def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ["LEVIATH_BROKER"])
    return s

def send(s, raw):
    s.sendall(raw + b"\n")
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(1 << 20)
        if not chunk:
            return {"closed": True, "bytes": len(buf)}
        buf += chunk
    reply = json.loads(buf)
    reply["bytes"] = len(buf)
    return reply

def call(s, tool, **args):
    return send(s, json.dumps({"op": "call", "tool": tool, "args": args}).encode())

def summary(reply):
    err = reply.get("error") or {}
    return {"ok": reply.get("ok"), "code": err.get("code"), "limit": err.get("limit"),
            "message": err.get("message", "")[:300], "bytes": reply.get("bytes"),
            "closed": reply.get("closed", False)}
"""

READS = r"""
import threading
from client import *
out = {}
def worker(i):
    s = connect()
    paths = [f"big/f{n:03}" for n in range(300)]
    first = summary(call(s, "read_files", paths=paths))
    small = call(s, "read_files", paths=paths[:40])
    files = (small.get("result") or {}).get("files", [])
    out[i] = {"all300": first, "forty": summary(small),
              "contents": sum(1 for f in files if "content" in f),
              "refused": [f.get("error", "")[:80] for f in files if "error" in f][:2]}
ts = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(out))
"""

EDIT = r"""
from client import *
s = connect()
print(json.dumps(summary(call(s, "edit_file", path="sparse.txt", old="needle", new="x"))))
"""

DEEP = r"""
from client import *
s = connect()
deep = summary(send(s, b"[" * 300000 + b"]" * 300000))
again = summary(call(s, "read_file", path="small.txt"))
print(json.dumps({"deep": deep, "again": again}))
"""

LONG = r"""
from client import *
s = connect()
line = json.dumps({"op": "call", "tool": "write_file",
                   "args": {"path": "w.txt", "content": "y" * (40 << 20)}}).encode()
long = summary(send(s, line))
again = summary(call(s, "read_file", path="small.txt"))
print(json.dumps({"long": long, "again": again}))
"""

CONNS = r"""
import socket, time
from client import *
held, refused, other = [], [], []
for i in range(600):
    try:
        s = connect()
    except OSError as e:
        other.append(str(e)); break
    held.append(s)
    # Half a request line each: the daemon must not buffer much per connection.
    try:
        s.sendall(b'{"op": "call", "tool": "write_file", "args": {"path": "p", "content": "'
                  + b"z" * 200000)
    except OSError:
        pass
time.sleep(1)
for s in held:
    s.setblocking(False)
    try:
        data = s.recv(4096)
    except BlockingIOError:
        continue
    except OSError:
        data = b""
    if data:
        refused.append(json.loads(data.split(b"\n")[0]))
print(json.dumps({"held": len(held), "refused": len(refused),
                  "first": refused[0] if refused else None, "other": other}))
"""

LEAK = r"""
from client import *
s = connect()
out = {}
for name in ("key", "nokey", "root", "sshdir", "nodir", "up"):
    r = call(s, "read_file", path=name)
    out[name] = (r.get("error") or {}).get("message", "OK " + str(r.get("result"))[:40])
r = call(s, "list_dir", path="sshdir")
out["list_sshdir"] = (r.get("error") or {}).get("message", "OK")
r = call(s, "list_dir", path="nodir")
out["list_nodir"] = (r.get("error") or {}).get("message", "OK")
print(json.dumps(out))
"""


def config(extra: str = "") -> str:
    return f"""
[sandbox]
kind = "namespace"

[resources]
memory_max = "160M"
{extra}
"""


class Agent:
    def __init__(self, bed: Testbed, user: str, agent_id: str, workdir: str) -> None:
        self.bed, self.user, self.id, self.workdir = bed, user, agent_id, workdir
        self.n = 0

    @property
    def dir(self) -> str:
        return f"{self.workdir}/.req/leviath-{self.id}"

    def py(self, script: str, timeout: float = 240) -> dict:
        self.n += 1
        n = self.n
        self.bed.run(["sh", "-c", f"mkdir -p {self.dir} && cd {self.dir} && cat > {n}.py && "
                      f"echo 'cd {self.workdir} && PYTHONPATH=. python3 {self.dir}/{n}.py' "
                      f"> {n}.tmp && mv {n}.tmp {n}.sh"],
                     user=self.user, cwd=self.workdir, input=script)
        self.bed.run(["sh", "-c", f"until [ -f {self.dir}/{n}.rc ]; do sleep 0.05; done"],
                     timeout=timeout)
        out = self.bed.read_file(f"{self.dir}/{n}.out")
        err = self.bed.read_file(f"{self.dir}/{n}.err")
        rc = int(self.bed.read_file(f"{self.dir}/{n}.rc"))
        assert rc == 0, f"agent script failed ({rc}):\n{out}\n{err}"
        return dict(json.loads(out.splitlines()[-1]))


class Sampler:
    """The daemon's VmRSS, sampled as root inside the bed."""

    def __init__(self, bed: Testbed) -> None:
        self.bed = bed
        self.pid = bed.run(["systemctl", "show", "-p", "MainPID", "--value",
                            "leviathd"]).stdout.strip()
        bed.run(["rm", "-f", "/root/rss.log"])
        self.proc = subprocess.Popen(bed.command(
            ["sh", "-c", f"echo $$ > /root/rss.pid; "
             f"while :; do sed -n 's/^VmRSS:[^0-9]*\\([0-9]*\\).*/\\1/p' "
             f"/proc/{self.pid}/status >> /root/rss.log; sleep 0.05; done"]))

    def samples(self) -> list[int]:
        text = self.bed.run(["cat", "/root/rss.log"], check=False).stdout
        return [int(x) * 1024 for x in text.split() if x.isdigit()]

    def now(self, quiet: int = 40, wait: float = 60) -> int:
        """The RSS at the next quiescent point: `quiet` samples in a row
        (50 ms apart: 2 s, longer than heap.py's trim takes to come after
        the last call) equal, within `wait` s. A reading on the way, while
        the daemon still frees what a flood left, is no base to compare."""
        deadline = time.monotonic() + wait
        while True:
            tail = self.samples()[-quiet:]
            if len(tail) == quiet and len(set(tail)) == 1:
                return tail[-1]
            assert time.monotonic() < deadline, f"the daemon's RSS never settled: {tail}"
            time.sleep(0.25)

    def stop(self) -> None:
        # The loop runs inside the bed: end it there, by the pid it wrote.
        self.bed.run(["sh", "-c", "kill $(cat /root/rss.pid)"], check=False)
        self.proc.kill()
        self.proc.wait()


def active(bed: Testbed) -> bool:
    r = bed.run(["systemctl", "is-active", "leviathd"], check=False)
    return r.stdout.strip() == "active"


def prepare(bed: Testbed) -> None:
    """alice's workdir (300 files of 1 MiB, a 512 MiB sparse file, links
    out of her view), the blueprint and the config; the daemon restarted."""
    h = bed.users["alice"].home
    bed.run(f"""
        set -e
        mkdir -p {h}/bw/big {h}/bbp {h}/.ssh
        cat > {h}/bbp/blueprint.toml
        for i in $(seq -w 0 299); do head -c 1048576 /dev/zero | tr '\\0' a > {h}/bw/big/f$i; done
        truncate -s 512M {h}/bw/sparse.txt
        printf 'small\\n' > {h}/bw/small.txt
        printf 'PRIVATE-KEY' > {h}/.ssh/id_ed25519
        ln -sfn {h}/.ssh/id_ed25519 {h}/bw/key
        ln -sfn {h}/.ssh/no_such_key {h}/bw/nokey
        ln -sfn /root/nothing {h}/bw/root
        ln -sfn {h}/.ssh {h}/bw/sshdir
        ln -sfn {h}/.no_such_dir {h}/bw/nodir
        ln -sfn .. {h}/bw/up
    """, user="alice", input=BLUEPRINT)
    bed.run(["sh", "-c", "cat > loop.sh"], user="alice", cwd=f"{h}/bw", input=LOOP)
    bed.run(["sh", "-c", "cat > client.py"], user="alice", cwd=f"{h}/bw", input=CLIENT)
    bed.write_file("/etc/leviath/config.toml", config())
    bed.run(["systemctl", "restart", "leviathd"])


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    prepare(testbed)
    yield testbed
    h = testbed.users["alice"].home
    testbed.run(["rm", "-rf", f"{h}/bw", f"{h}/bbp"])


def start_agent(bed: Testbed) -> Agent:
    h = bed.users["alice"].home
    out = bed.run(["lev", "run", "--detach", f"{h}/bbp"], user="alice",
                  cwd=f"{h}/bw").stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", out), out
    return Agent(bed, "alice", out, f"{h}/bw")


def stop_agent(agent: Agent) -> None:
    agent.bed.run(["lev", "stop", agent.id], user="alice", check=False)


def abuse(bed: Testbed, agent: Agent, threads: int) -> dict:
    """Everything at once an agent may try, in turn; the daemon's RSS around it."""
    sampler = Sampler(bed)
    try:
        agent.py("from client import *\nprint(json.dumps(summary(call(connect(), "
                 "'read_file', path='small.txt'))))")
        start = sampler.now()
        out = {"reads": agent.py(f"THREADS = {threads}\n" + READS), "edit": agent.py(EDIT),
               "deep": agent.py(DEEP), "long": agent.py(LONG), "conns": agent.py(CONNS)}
        peak = max(sampler.samples())
        after = sampler.now()
    finally:
        sampler.stop()
    print(f"daemon RSS under one agent's abuse: start {start / MB:.1f} MB, "
          f"peak {peak / MB:.1f} MB (+{(peak - start) / MB:.1f}), "
          f"after {after / MB:.1f} MB (+{(after - start) / MB:.1f})")
    return {**out, "start": start, "peak": peak, "after": after}


def test_abuse_from_inside_an_agent_costs_the_daemon_little_and_gets_named_refusals(
    bed: Testbed,
) -> None:
    # A fresh daemon: the bed is shared, and what earlier tests left in the
    # daemon's heap (freed but not returned to the system) is not this
    # agent's cost. The bound is on what this abuse adds and keeps.
    bed.run(["systemctl", "restart", "leviathd"])
    agent = start_agent(bed)
    try:
        got = abuse(bed, agent, int(os.environ.get("LEVIATH_ABUSE_THREADS", "8")))
        reads, edit, deep, long, conns = (got[k] for k in ("reads", "edit", "deep", "long",
                                                             "conns"))
        start, peak, after = got["start"], got["peak"], got["after"]
        for r in reads.values():
            assert r["all300"]["code"] == "too-large", r
            # With more threads than concurrent calls, some are refused for that.
            assert r["all300"]["limit"] in ("read_max_paths", "max_concurrent_calls"), r
            assert r["forty"]["bytes"] <= MB + 64, r
            if r["forty"]["ok"]:
                assert r["contents"] >= 1, r
            else:  # more threads than concurrent calls: refused by name
                assert r["forty"]["limit"] == "max_concurrent_calls", r
        assert any(r["forty"]["ok"] for r in reads.values()), reads
        assert edit["code"] == "too-large" and edit["limit"] == "edit_max_bytes", edit
        assert deep["deep"]["code"] == "too-large", deep
        assert deep["deep"]["limit"] == "json_max_depth", deep
        assert deep["again"]["ok"], deep
        assert long["long"]["code"] == "too-large", long
        assert long["long"]["limit"] == "request_max_bytes", long
        assert long["again"]["ok"], long
        assert conns["refused"] >= 1, conns
        assert conns["first"]["error"]["code"] == "too-large", conns
        assert conns["first"]["error"]["limit"] == "max_connections", conns
        assert active(bed)

        # Large buffers are unmapped when freed (leviathd/heap.py): without
        # that, glibc kept ~1 MiB per broker thread and more in its arenas
        # (peak +8.5, after +4.5 to +10.4 MB; with it +5 and +1.2 to +2.8).
        assert peak - start < 15 * MB, (start, peak, after)
        assert after - start < 4 * MB, (start, peak, after)
    finally:
        stop_agent(agent)


def test_the_heavy_work_runs_in_the_agents_scope_which_runs_out_of_memory_not_the_daemon(
    bed: Testbed,
) -> None:
    # Raise the edit limit over the agent's MemoryMax: the edit's worker is
    # what the kernel kills, inside the agent's scope.
    bed.write_file("/etc/leviath/config.toml", config('[broker]\nedit_max_bytes = "1G"\n'))
    bed.run(["systemctl", "restart", "leviathd"])
    agent = start_agent(bed)
    sampler = Sampler(bed)
    try:
        start = sampler.now()
        unit = f"leviath-alice-boundtest-{agent.id}.scope"
        probe = agent.py("from client import *\nprint(json.dumps(summary(call(connect(), "
                         "'read_file', path='small.txt'))))")
        assert probe["ok"], probe
        workers = bed.run(["pgrep", "-u", "alice", "-f", "opener_worker"]).stdout.split()
        assert workers, "no file worker process"
        for pid in workers:
            cgroup = bed.read_file(f"/proc/{pid}/cgroup")
            assert unit in cgroup, cgroup
        edit = agent.py(EDIT)
        assert not edit["ok"] and edit["code"] in ("failed", "too-large"), edit
        peak = max(sampler.samples())
        assert peak - start < 30 * MB, (start, peak)
        cgroup = bed.run(["systemctl", "show", "-p", "ControlGroup", "--value",
                          unit]).stdout.strip()
        events = bed.run(f"cat /sys/fs/cgroup/memory{cgroup}/memory.oom_control "
                         f"/sys/fs/cgroup{cgroup}/memory.events 2>/dev/null || true").stdout
        kills = [int(line.split()[1]) for line in events.splitlines()
                 if line.startswith("oom_kill ")]
        print(f"edit over the agent's memory: {edit}; OOM kills in the agent's scope: {kills}")
        assert kills and max(kills) >= 1, events
        again = agent.py("from client import *\nprint(json.dumps(summary(call(connect(), "
                         "'read_file', path='small.txt'))))")
        assert again["ok"], again
        assert active(bed)
    finally:
        sampler.stop()
        stop_agent(agent)
        bed.write_file("/etc/leviath/config.toml", config())
        bed.run(["systemctl", "restart", "leviathd"])


def test_a_refused_path_outside_the_view_gets_one_message_whatever_exists_there(
    bed: Testbed,
) -> None:
    agent = start_agent(bed)
    try:
        out = agent.py(LEAK)
        print(out)
        assert "PRIVATE-KEY" not in json.dumps(out)
        # One message for a path that exists and one that does not, in a
        # hidden folder, in root's, and for a folder: only the name given differs.
        generic = {k: v.replace(k, "NAME") for k, v in out.items() if not k.startswith("list")}
        names = ("key", "nokey", "root", "sshdir", "nodir", "up")
        assert len({generic[k] for k in names}) == 1, out
        assert ".ssh" not in json.dumps(generic) and "/root/" not in json.dumps(generic), out
        listed = {out["list_sshdir"].replace("sshdir", "NAME"),
                  out["list_nodir"].replace("nodir", "NAME")}
        assert len(listed) == 1, out
    finally:
        stop_agent(agent)


MIDSIZE = r"""
import threading, time
from client import *
out = {}
def worker(i):
    s = connect()
    ok, codes = 0, set()
    def served(tool, **args):
        # Past max_concurrent_calls (4; 8 connections here) the call is
        # refused by name and tried again, so every round is the same work.
        while True:
            r = call(s, tool, **args)
            err = r.get("error") or {}
            codes.add(str(err.get("limit") or err.get("code")))
            if err.get("limit") != "max_concurrent_calls":
                return r
            time.sleep(0.002)
    for n in range(ROUNDS):
        # Just under glibc's fixed mmap threshold (128 KiB): these come from
        # the arenas, not from mappings of their own.
        size = 60000 + (n * 7919 + i * 104729) % 60000
        for r in (served("write_file", path=f"mid/t{i}-{n % 4}", content="m" * size),
                  served("read_file", path=f"mid/t{i}-{n % 4}")):
            ok += bool(r.get("ok"))
    out[i] = [ok, sorted(codes)]
ts = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(out))
"""


def test_many_mid_size_calls_do_not_grow_the_daemon_round_after_round(bed: Testbed) -> None:
    """Red team: buffers just under the fixed mmap threshold stay in glibc's
    arenas; repeated floods of them must not add up (bounded by the arenas,
    not by the number of calls). They fragmented the heap: before one arena
    and malloc_trim (leviathd/heap.py) each round of 960 calls left the daemon
    ~0.5 MB bigger (14 rounds: +5.2 -> +12.6 MB), all of it free memory in
    holes no later call fitted; now +0.4 -> +1.4 MB, the edges of those holes'
    pages. LEVIATH_MID_ROUNDS runs longer."""
    bed.run(["systemctl", "restart", "leviathd"])
    h = bed.users["alice"].home
    bed.run(["mkdir", "-p", f"{h}/bw/mid"], user="alice")
    agent = start_agent(bed)
    sampler = Sampler(bed)
    rounds = max(int(os.environ.get("LEVIATH_MID_ROUNDS", "12")), 4)
    try:
        agent.py("from client import *\nprint(json.dumps(summary(call(connect(), "
                 "'read_file', path='small.txt'))))")
        start = sampler.now()
        afters = []
        for _ in range(rounds):
            got = agent.py("THREADS = 8\nROUNDS = 60\n" + MIDSIZE)
            assert sum(v[0] for v in got.values()) == 8 * 60 * 2, got
            afters.append(sampler.now())
        peak = max(sampler.samples())
    finally:
        sampler.stop()
        stop_agent(agent)
    print(f"refusals seen: {sorted({c for v in got.values() for c in v[1]})}")
    print(f"mid-size floods: start {start / MB:.1f} MB, peak +{(peak - start) / MB:.1f}, "
          f"after each round " + ", ".join(f"+{(a - start) / MB:.1f}" for a in afters))
    # After the first round the daemon is back near its start: with a malloc
    # arena per broker thread each kept its top, +2.7 MB (+0.5 in one arena).
    assert afters[0] - start < 2 * MB, (start, afters)
    # From the second round on (the first fills the heap): at most 0.2 MB a
    # round, ~3 times what is left (0.07), under half the creep it had.
    creep = (afters[-1] - afters[1]) / (rounds - 2)
    assert creep < 0.2 * MB, (start, afters)
    assert afters[-1] - start < 5 * MB, (start, afters)
    assert active(bed)
