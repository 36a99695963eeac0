"""Gate decision time with 1,000 read-path patterns and 1,000 allowlist
rules and 100 policy rules (p50/p99), and the broker's read_file round trip against a direct
read of the same 4 KiB file, same run, ratio printed.

    PYTHONPATH=. /opt/leviath-dev/venv/bin/python bench/gate_bench.py
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

from leviathd.broker.core import Broker
from leviathd.broker.server import BrokerServer, cgroup_of
from leviathd.cli.tool import BrokerClient
from leviathd.domain.sensitivity import Sensitivity
from leviathd.identity import UserInfo
from leviathd.policy.approvals import ApprovalQueue
from leviathd.policy.decision import Call, Facts, decide
from leviathd.policy.ledger import Ledger
from leviathd.policy.rules import RuleSpec
from leviathd.policy.settings import CompiledPolicy, PolicySettings

HOME = "/home/bench"
FACTS = Facts(args={"path": "x"}, agent={"id": "a", "user": "bench", "groups": ("bench",)},
              ledger=tuple(("read_file", f"/w/f{i}", "internal") for i in range(32)))
WORK = "/srv/bench/work"


def read_patterns(n: int = 1000) -> list[str]:
    """60% exact (home, absolute, relative), 29% globs, 10% indexed regexes,
    1% regexes with alternation (tried one by one on every miss)."""
    out: list[str] = []
    for i in range(n):
        r = i % 100
        if r < 30:
            out.append(f"~/projects/p{i}/docs")
        elif r < 50:
            out.append(f"/data/team{i}/reports")
        elif r < 60:
            out.append(f"../shared{i}")
        elif r < 75:
            out.append(f"glob:~/design{i}/**/*.md")
        elif r < 89:
            out.append(f"glob:/srv/runs{i}/*/logs/**")
        elif r < 99:
            out.append(f"regex:/archive/a{i}/[0-9]+/.*")
        else:
            out.append(f"regex:/(opt|var)/alt{i}/.*")
    return out


def allow_rules(n: int = 1000) -> list[dict[str, str]]:
    """50% `*.domain`, 30% exact hosts, 10% `prefix*`, 10% general globs."""
    out = []
    for i in range(n):
        r = i % 10
        if r < 5:
            target = f"*.svc{i}.example.com"
        elif r < 8:
            target = f"api{i}.example.net"
        elif r < 9:
            target = f"hook{i}-*"
        else:
            target = f"s?{i}.*.cdn.org"
        out.append({"tool": "http_post", "target": target, "max_sensitivity": "private"})
    return out


def policy_rules(n: int = 100) -> list[RuleSpec]:
    """90% name their tool first (the index skips them for other tools), 10% not."""
    out = []
    for i in range(n):
        r = i % 10
        if r < 5:
            when = f'call.tool == "http_post" && call.target.endsWith(".bad{i}.example")'
            decision = "deny"
        elif r < 8:
            when = f'call.tool == "read_file" && call.target.startsWith("/secret{i}/")'
            decision = "deny"
        elif r < 9:
            when = f'call.tool in ["shell", "http_get"] && call.target.contains("x{i}")'
            decision = "ask"
        else:
            when = f'agent.user == "mallory{i}" && rank(taint) >= rank("internal")'
            decision = "deny"
        out.append(RuleSpec(f"r{i}", when, decision))  # type: ignore[arg-type]
    return out


def pct(samples: list[int], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))] / 1000.0


def bench_gate(n_rules: int = 100) -> None:
    t0 = time.perf_counter()
    settings = PolicySettings(read_paths=read_patterns(), allowlist=allow_rules(),
                              taint_enabled=True, rules=policy_rules(n_rules))
    policy = CompiledPolicy(settings, home=HOME, workdir=WORK)
    compile_ms = (time.perf_counter() - t0) * 1000
    rng = random.Random(1)
    X = Sensitivity.PRIVATE

    def read(path: str) -> Callable[[], object]:
        call = Call("read_file", path, (path,))
        return lambda: decide(policy, call, Sensitivity.PUBLIC, facts=FACTS)

    def post(host: str) -> Callable[[], object]:
        call = Call("http_post", host)
        return lambda: decide(policy, call, X, facts=FACTS)

    cases: dict[str, list[Callable[[], object]]] = {
        "read inside workdir": [read(f"{WORK}/src/m{i}.py") for i in range(50)],
        "read granted (exact)": [read(f"{HOME}/projects/p{i}/docs/a/b.md")
                                 for i in range(0, 1000, 100)],
        "read granted (glob)": [read(f"{HOME}/design{i}/x/y/z.md") for i in range(60, 1000, 100)],
        "read granted (regex)": [read(f"/archive/a{i}/2024/f") for i in range(89, 1000, 100)],
        "read refused (no grant)": [read(f"/home/bench/.ssh/id_{i}") for i in range(50)]
        + [read(f"/etc/deep/a/b/c/d/e/f{i}") for i in range(50)],
        "post allowlisted (suffix)": [post(f"api.svc{i}.example.com") for i in range(0, 1000, 10)],
        "post allowlisted (general)": [post(f"s1{i}.eu.cdn.org") for i in range(9, 1000, 10)],
        "post not covered → ask": [post(f"evil{i}.example.org") for i in range(50)],
    }
    for fns in cases.values():  # warm up
        for fn in fns:
            fn()
    print(f"gate: 1,000 read-path patterns + 1,000 allowlist rules + {n_rules} policy rules, "
          "compiled in "
          f"{compile_ms:.0f} ms")
    print(f"  {'case':<28} {'p50 µs':>8} {'p99 µs':>8}")
    everything: list[int] = []
    for name, fns in cases.items():
        samples = []
        for _ in range(20000 // len(fns) + 1):
            for fn in fns:
                start = time.perf_counter_ns()
                fn()
                samples.append(time.perf_counter_ns() - start)
        rng.shuffle(samples)
        everything.extend(samples)
        print(f"  {name:<28} {pct(samples, .5):8.1f} {pct(samples, .99):8.1f}")
    print(f"  {'all decisions':<28} {pct(everything, .5):8.1f} {pct(everything, .99):8.1f}"
          f"   (n={len(everything)}, aim p99 < 100 µs)")


def bench_broker() -> None:
    tmp = tempfile.mkdtemp(prefix="lev-bench-")
    home, work = os.path.join(tmp, "home"), os.path.join(tmp, "work")
    os.mkdir(home)
    os.mkdir(work)
    path = os.path.join(work, "f.bin")
    with open(path, "w") as f:
        f.write("x" * 4096)
    own = cgroup_of(os.getpid())
    user = UserInfo("bench", os.getuid(), os.getgid(), tuple(os.getgroups()), home)
    settings = PolicySettings()  # the default budget, as agents have it
    broker = Broker(agent_id="bench000", user=user, workdir=work, settings=settings,
                    ledger=Ledger(settings.budget),
                    approvals=ApprovalQueue(agent_id="bench000", owner_uid=user.uid, timeout=1),
                    audit=lambda record: None)
    server = BrokerServer(broker, lookup=lambda p: "bench000" if p == own else None,
                          path=os.path.join(tmp, "b.sock"))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    client = BrokerClient(server.path)
    n = 2000

    def direct() -> None:
        with open(path, "rb") as fh:
            fh.read()

    def brokered() -> None:
        reply = client.call("read_file", {"path": "f.bin"})
        assert reply["ok"] and len(reply["result"]["content"]) == 4096

    results = {}
    for name, fn in (("direct open+read", direct), ("broker read_file", brokered)):
        for _ in range(200):
            fn()
        samples = []
        for _ in range(n):
            start = time.perf_counter_ns()
            fn()
            samples.append(time.perf_counter_ns() - start)
        results[name] = statistics.median(samples) / 1000.0
        print(f"  {name:<20} median {results[name]:8.1f} µs   p99 {pct(samples, .99):8.1f} µs")
    ratio = results["broker read_file"] / results["direct open+read"]
    print(f"  ratio broker/direct (median): {ratio:.0f}x")
    client.close()
    asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
    broker.close()
    loop.call_soon_threadsafe(loop.stop)
    import shutil

    shutil.rmtree(tmp)


if __name__ == "__main__":
    bench_gate(0)
    bench_gate(100)
    print("broker: read_file of a 4 KiB workdir file, one connection, sequential calls")
    bench_broker()
