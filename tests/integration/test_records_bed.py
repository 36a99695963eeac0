"""Agent records that neither stop the daemon nor grow without bound (issues 17
§2-3 and 24 §2): a garbage and an empty record under running agents, a
retention policy, and `List` pages that stay under a fixed size."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from journal_wait import journal_with
from testbed import Testbed

pytestmark = pytest.mark.testbed

AGENTS = "/var/lib/leviath/agents"
SCRATCH = "/var/lib/leviath/scratch"
CONFIG = """
[sandbox]
kind = "namespace"
{extra}
"""
PY = "/opt/leviath-dev/venv/bin/python"


def configure(bed: Testbed, extra: str = "") -> None:
    bed.write_file("/etc/leviath/config.toml", CONFIG.format(extra=extra))
    bed.run(["systemctl", "restart", "leviathd"])


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    configure(testbed)
    for user in ("alice", "bob", "dave", "carol"):
        testbed.run(["mkdir", "-p", "work"], user=user)
    yield testbed
    testbed.run(f"rm -rf {AGENTS}/5eed* {AGENTS}/bad", check=False)
    configure(testbed)


def lev(bed: Testbed, user: str, *args: str, check: bool = True, timeout: float = 60):
    return bed.run(["lev", *args], user=user, cwd=f"{bed.users[user].home}/work",
                   check=check, timeout=timeout)


def rows(bed: Testbed, user: str, *args: str) -> dict[str, dict]:
    return {r["id"]: r for r in json.loads(lev(bed, user, "ps", "--json", *args).stdout)}


def ended_of(bed: Testbed, user: str) -> list[str]:
    return [i for i, r in rows(bed, user, "--all").items() if r["state"] != "running"]


def exists(bed: Testbed, path: str) -> bool:
    return bed.run(["test", "-e", path], check=False).returncode == 0


def test_a_garbage_and_an_empty_record_under_running_agents(bed: Testbed) -> None:
    a = lev(bed, "alice", "run", "--detach", "--", "sleep", "300").stdout.strip()
    b = lev(bed, "alice", "run", "--detach", "--", "sleep", "300").stdout.strip()
    try:
        assert exists(bed, f"{SCRATCH}/{a}") and exists(bed, f"{SCRATCH}/{b}")
        bed.run(["systemctl", "stop", "leviathd"])
        bed.run(["sh", "-c", f"printf '\\377\\376\\000garbage' > {AGENTS}/{a}.json"])
        bed.run(["sh", "-c", f": > {AGENTS}/{b}.json"])
        bed.run(["systemctl", "start", "leviathd"])
        assert bed.run(["systemctl", "is-active", "leviathd"]).stdout.strip() == "active"
        # Both are still listed, for their owner, as unknown; their scratch stays.
        mine = rows(bed, "alice")
        assert mine[a]["state"] == "unknown" and mine[b]["state"] == "unknown", mine
        assert mine[a]["user"] == "alice"
        assert exists(bed, f"{SCRATCH}/{a}") and exists(bed, f"{SCRATCH}/{b}")
        # Bob does not see them; the bad files were moved aside, with a warning.
        assert a not in rows(bed, "bob")
        bad = bed.run(["ls", f"{AGENTS}/bad"]).stdout
        assert f"{a}.json" in bad and f"{b}.json" in bad
        log = journal_with(bed, ["-u", "leviathd", "-p", "warning", "-o", "cat", "-n", "50"],
                           f"{a}.json cannot be read", f"{b}.json cannot be read")
        assert f"{a}.json cannot be read" in log and f"{b}.json cannot be read" in log
        # The owner stops one, an admin the other; then both end as stopped
        # (their supervisors still leave the exit record) and their scratch
        # goes with their scope.
        lev(bed, "alice", "stop", a)
        lev(bed, "dave", "stop", b)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            every = rows(bed, "alice", "--all")
            if every[a]["state"] == "stopped" and every[b]["state"] == "stopped":
                break
            time.sleep(0.5)
        assert every[a]["state"] == "stopped" and every[b]["state"] == "stopped", every
        assert not exists(bed, f"{SCRATCH}/{a}") and not exists(bed, f"{SCRATCH}/{b}")
    finally:
        for agent in (a, b):
            lev(bed, "dave", "stop", agent, check=False)


def test_an_unknown_agent_that_ends_keeps_its_exit_status(bed: Testbed) -> None:
    """Its record was unreadable at start; its supervisor still records how
    it ended, and that is what it is listed with (not `lost`)."""
    work = f"{bed.users['alice'].home}/work"
    bed.run(["rm", "-f", f"{work}/go"])
    a = lev(bed, "alice", "run", "--detach", "--", "sh", "-c",
            "while [ ! -e go ]; do sleep 0.1; done; exit 5").stdout.strip()
    try:
        bed.run(["systemctl", "stop", "leviathd"])
        bed.run(["sh", "-c", f"printf 'garbage' > {AGENTS}/{a}.json"])
        bed.run(["systemctl", "start", "leviathd"])
        assert rows(bed, "alice")[a]["state"] == "unknown"
        bed.run(["touch", f"{work}/go"], user="alice")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = rows(bed, "alice", "--all")[a]
            if got["state"] != "unknown":
                break
            time.sleep(0.5)
        assert (got["state"], got.get("exit_status")) == ("exited", 5), got
        assert not exists(bed, f"{SCRATCH}/{a}")
    finally:
        bed.run(["rm", "-f", f"{work}/go"], check=False)
        lev(bed, "dave", "stop", a, check=False)


SEED = r"""
import json, os, sys, time
d = "/var/lib/leviath/agents"
uid, count, age = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
now = time.time() - age
for n in range(count):
    aid = "5eed%04x" % n
    rec = {
        "id": aid, "uid": uid, "user": "alice", "agent": "old",
        "command": ["/bin/sh", "-c", "echo an old agent number %d" % n],
        "workdir": "/home/alice/work", "unit": "leviath-alice-old-%s.scope" % aid,
        "sandbox": "namespace", "started_at": now + n, "ended_at": now + n + 1,
        "exit_status": 0, "state": "exited",
    }
    with open(os.path.join(d, aid + ".json"), "w") as f:
        json.dump(rec, f)
"""

FORGET_ENDED = r"""
import json, os, sys
d = "/var/lib/leviath/agents"
for name in os.listdir(d):
    if not name.endswith(".json") or name.endswith(".spec.json"):
        continue
    try:
        rec = json.load(open(os.path.join(d, name)))
    except ValueError:
        continue
    if rec.get("uid") == int(sys.argv[1]) and rec.get("state") != "running":
        os.unlink(os.path.join(d, name))
"""

PAGE = r"""
import asyncio
from dbus_fast import BusType, Message, Variant
from dbus_fast.aio import MessageBus

def call(member, signature, body):
    return Message(destination="org.leviath.Manager1", path="/org/leviath/Manager1",
                   interface="org.leviath.Manager1", member=member, signature=signature,
                   body=body)

async def main():
    bus = await MessageBus(bus_type=BusType.SYSTEM).connect()
    reply = await bus.call(call("List", "b", [True]))
    sizes = [len(reply._marshall(False))]
    first = len(reply.body[0])
    cursor, total, pages = "", 0, 0
    while True:
        reply = await bus.call(call("ListPage", "a{sv}", [
            {"all": Variant("b", True), "cursor": Variant("s", cursor)}]))
        sizes.append(len(reply._marshall(False)))
        rows, cursor = reply.body
        total += len(rows)
        pages += 1
        if not cursor:
            break
    print(max(sizes), first, total, pages)

asyncio.run(main())
"""


def test_list_pages_stay_under_256_kib_and_lev_ps_all_pages_through(bed: Testbed) -> None:
    uid = str(bed.users["alice"].uid)
    bed.run([PY, "-c", SEED, uid, "4000", "3600"])
    configure(bed, "[records]\nmax_per_user = 10000\n")
    try:
        out = bed.run([PY, "-c", PAGE], user="dave").stdout.split()
        biggest, first, total, pages = map(int, out)
        assert biggest < 256 * 1024, out
        assert 0 < first < 4000 and total >= 4000 and pages > 1, out
        every = rows(bed, "alice", "--all")
        assert sum(1 for i in every if i.startswith("5eed")) == 4000
    finally:
        bed.run(f"rm -f {AGENTS}/5eed*", check=False)
        configure(bed)


def test_retention_forgets_old_and_surplus_ended_agents(bed: Testbed) -> None:
    uid = str(bed.users["alice"].uid)
    try:
        # Only the seeded agents are alice's ended ones (earlier tests ended others).
        bed.run(["systemctl", "stop", "leviathd"])
        bed.run([PY, "-c", FORGET_ENDED, uid])
        configure(bed, "[records]\nkeep_days = 2\nmax_per_user = 5\n")
        # 10 agents that ended three days ago: all past keep_days.
        bed.run([PY, "-c", SEED, uid, "10", str(3 * 86400)])
        bed.run(["systemctl", "restart", "leviathd"])
        assert not bed.run(f"ls {AGENTS} | grep ^5eed", check=False).stdout
        # 10 recent ones: the 5 oldest go, at start and again after an agent ends.
        bed.run([PY, "-c", SEED, uid, "10", "600"])
        bed.run(["systemctl", "restart", "leviathd"])
        left = bed.run(f"ls {AGENTS} | grep '^5eed.*json$'", check=False).stdout.split()
        assert left == [f"5eed{n:04x}.json" for n in range(5, 10)], left
        assert sorted(ended_of(bed, "alice")) == [f"5eed{n:04x}" for n in range(5, 10)]
        lev(bed, "alice", "run", "--", "true")
        time.sleep(1)
        ended = ended_of(bed, "alice")
        assert len(ended) == 5 and "5eed0005" not in ended, ended
    finally:
        bed.run(f"rm -f {AGENTS}/5eed*", check=False)
        configure(bed)
