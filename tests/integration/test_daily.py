"""Daily use as people expect (issue 14), in the test bed: the owner reads
her agent's output with plain `journalctl -u`, bob does not; a config edit
right after a restart is applied; the daemon's and lev's --help/--version;
messages outside an agent."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

CONFIG = '[sandbox]\nkind = "namespace"\n'


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    testbed.run(["systemctl", "restart", "leviathd"])
    testbed.run(["mkdir", "-p", "work"], user="alice")
    yield testbed


def _run_detached(bed: Testbed, user: str, *command: str) -> dict:
    home = bed.users[user].home
    agent_id = bed.run(["lev", "run", "--detach", "--workdir", f"{home}/work", "--", *command],
                       user=user).stdout.strip()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = json.loads(bed.run(["lev", "ps", "--all", "--json"], user=user).stdout)
        row = next(r for r in rows if r["id"] == agent_id)
        if row["state"] != "running":
            return row
        time.sleep(0.3)
    raise AssertionError(f"agent {agent_id} still running")


def _journal(bed: Testbed, user: str | None, *args: str) -> str:
    deadline = time.monotonic() + 10
    while True:
        r = bed.run(["journalctl", "--no-pager", "-q", *args], user=user, check=False)
        if r.stdout.strip() or time.monotonic() > deadline:
            return r.stdout
        time.sleep(0.3)


def test_the_owner_reads_her_agents_output_with_journalctl_and_bob_does_not(
    bed: Testbed,
) -> None:
    row = _run_detached(bed, "alice", "sh", "-c", "echo journal-out-7; echo journal-err-7 >&2")
    unit = row["unit"]
    mine = _journal(bed, "alice", "-o", "cat", "-u", unit)
    assert "journal-out-7" in mine and "journal-err-7" in mine, mine
    entries = [json.loads(x) for x in _journal(bed, "alice", "-o", "json", "-u", unit).splitlines()]
    out = next(e for e in entries if e.get("MESSAGE") == "journal-out-7")
    assert out["_SYSTEMD_UNIT"] == unit
    assert out["_UID"] == str(bed.users["alice"].uid)
    assert out["PRIORITY"] == "6"
    # bob: nothing of alice's agent, by unit or by any match he may try.
    for args in (["-u", unit], [f"_SYSTEMD_UNIT={unit}"], ["--grep", "journal-out-7"]):
        r = bed.run(["journalctl", "--no-pager", "-o", "cat", *args], user="bob", check=False)
        assert "journal-out-7" not in r.stdout + r.stderr, args
    # The daemon's own records of the agent keep their fields (system journal).
    events = _journal(bed, None, "-o", "cat", f"LEVIATH_AGENT={row['id']}")
    assert row["id"] in events
    logs = bed.run(["lev", "logs", row["id"]], user="alice").stdout
    assert "journal-out-7" in logs and "journal-err-7" in logs
