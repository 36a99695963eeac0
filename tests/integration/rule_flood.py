"""Alice's largest rule set and an agent of hers flooding tool calls under it
(issue 31 §4), for tests/integration/test_rule_fairness_bed.py and
bench/rule_fairness.py.

Her user config and her blueprint each hold MAX_RULES deny rules whose
condition is 25 string tests of `call.args.path`, none matching; the agent
sends read_file calls with a 48,000-character path on four connections at
once (the broker's default max_concurrent_calls), so each rule would cost
about 19,000 steps, just under its own budget. The flood runs until a file
`stop` appears in the workdir and leaves the number of replies in `count`."""

from __future__ import annotations

import time

from loop_agent import lay_out
from testbed import Testbed

from leviathd.policy.rules import MAX_RULES

WORKDIR = "flood"
BLUEPRINT_DIR = "floodbp"


def _tree(n: int) -> str:
    if n == 1:
        return 'call.args.path.contains("q")'
    return "(" + _tree(n // 2) + " || " + _tree(n - n // 2) + ")"


def rules(prefix: str) -> str:
    when = _tree(25)
    return "".join(f"\n[[rules]]\nname = \"{prefix}{i}\"\nwhen = '{when}'\ndecision = \"deny\"\n"
                   for i in range(MAX_RULES))


BLUEPRINT = """
[agent]
name = "flooder"
command = ["python3", "flood.py"]
"""

FLOOD = r"""
import json, os, socket, threading
path = "a" * 48000
count = [0]
lock = threading.Lock()

def worker():
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["LEVIATH_BROKER"])
    f = s.makefile("rb")
    n = 0
    while not os.path.exists("stop"):
        n += 1
        s.sendall(json.dumps({"op": "call", "tool": "read_file", "args": {"path": path},
                              "id": n}).encode() + b"\n")
        if not f.readline():
            break
        with lock:
            count[0] += 1
            if count[0] == 1:
                open("started", "w").close()

threads = [threading.Thread(target=worker) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with open("count", "w") as out:
    out.write(str(count[0]))
"""


def lay_out_flood(bed: Testbed, *, with_rules: bool = True) -> str:
    """Alice's blueprint and flood script, and her user config with (or
    without) the rules; returns her user config's previous text ("" for
    none), for `restore`."""
    home = bed.users["alice"].home
    lay_out(bed, WORKDIR, BLUEPRINT_DIR, BLUEPRINT + (rules("bp") if with_rules else ""),
            {f"{WORKDIR}/flood.py": FLOOD})
    config = f"{home}/.config/leviath/config.toml"
    old = bed.run(["cat", config], user="alice", check=False).stdout
    bed.run(["sh", "-c", f"mkdir -p {home}/.config/leviath && cat > {config}"], user="alice",
            input=old + (rules("user") if with_rules else ""))
    return old


def restore(bed: Testbed, old: str) -> None:
    home = bed.users["alice"].home
    bed.run(["sh", "-c", f"cat > {home}/.config/leviath/config.toml"], user="alice", input=old)


class Flood:
    """Alice's flooding agent while the `with` block runs."""

    def __init__(self, bed: Testbed) -> None:
        self.bed = bed
        self.home = bed.users["alice"].home
        self.workdir = f"{self.home}/{WORKDIR}"
        self.agent = ""
        self.count = 0

    def __enter__(self) -> Flood:
        self.bed.run(["rm", "-f", "stop", "count", "started"], user="alice", cwd=self.workdir)
        self.agent = self.bed.run(["lev", "run", "--detach", f"{self.home}/{BLUEPRINT_DIR}"],
                                  user="alice", cwd=self.workdir).stdout.strip()
        deadline = time.monotonic() + 60
        while self.bed.run(["test", "-e", f"{self.workdir}/started"],
                           check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise AssertionError("alice's flood never got a reply")
            time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self.bed.run(["touch", "stop"], user="alice", cwd=self.workdir)
        deadline = time.monotonic() + 60
        while self.bed.run(["test", "-e", f"{self.workdir}/count"],
                           check=False).returncode != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        text = self.bed.run(["cat", f"{self.workdir}/count"], check=False).stdout.strip()
        self.count = int(text) if text.isdigit() else 0
        self.bed.run(["lev", "stop", self.agent], user="alice", check=False)
