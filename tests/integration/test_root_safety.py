"""Root never acts by path where a user can write (issue 9, section 1).

alice, from a plain shell on the host (no agent needed), runs a compiled
inotify racer over /run/leviath/agents: every new entry in her agents'
folders (broker.sock, anything else the daemon makes there) is renamed away
at once and replaced by a symlink to a root-owned file. Meanwhile ~50 agents
start and stop and the daemon restarts twice (with agents running, so their
folders already exist when it comes back). Afterwards every root-owned target
still has its owner, mode and content: root's chmod/chown/bind never landed on
them. Before the fix the racer handed alice /etc/leviath/config.toml."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from testbed import Testbed

HERE = Path(__file__).resolve().parent
RACER = "/usr/local/libexec/leviath-test-racer"
AGENTS = "/run/leviath/agents"
VICTIM = "/etc/leviath/victim"
STOP = "/tmp/leviath-test-racer.stop"
CONFIG_PATH = "/etc/leviath/config.toml"
CONFIG = """
[sandbox]
kind = "namespace"

[resources]
memory_max = "96M"
tasks_max = 64
"""


def lev(bed: Testbed, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return bed.run(["lev", *args], user="alice", cwd=f"{bed.users['alice'].home}/rw",
                   check=check, timeout=60)


def facts(bed: Testbed, path: str) -> str:
    return bed.run(["sh", "-c", f"stat -c '%F %u:%g %a' {path} && sha256sum < {path}"],
                   check=False).stdout


@pytest.fixture(scope="module")
def bed(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the racer")
    out = tmp_path_factory.mktemp("racer") / "racer"
    subprocess.run(["gcc", "-O2", "-o", str(out), str(HERE / "racer" / "swap.c")], check=True)
    testbed.copy_in(out, RACER, mode=0o755)
    saved = testbed.run(["cat", CONFIG_PATH], check=False).stdout
    testbed.write_file(CONFIG_PATH, CONFIG)
    testbed.write_file(VICTIM, "root's own secret\n", mode=0o600)
    testbed.run(["mkdir", "-p", "rw"], user="alice")
    testbed.run(["systemctl", "restart", "leviathd"])
    yield testbed
    # Whatever happened, leave the bed as it was for the other tests.
    testbed.run(["rm", "-f", VICTIM])
    testbed.write_file(CONFIG_PATH, saved)
    testbed.run(["systemctl", "restart", "leviathd"], check=False)


def plant(bed: Testbed, folder: str) -> None:
    bed.run(["chown", "alice:alice", folder])
    bed.run(["chmod", "0700", folder])
    bed.run(f"ln -s {VICTIM} {folder}/planted && mkdir -p {folder}/d/e && "
            f"ln -s /etc/leviath {folder}/d/e/up && ln -s {CONFIG_PATH} {folder}/d/f",
            user="alice")


def assert_root_folder(bed: Testbed, folder: str) -> None:
    """Root's, searchable by alice's group only, nothing in it but her sockets
    (the broker's, and the proxy's: the default network since issue 30)."""
    assert bed.run(["stat", "-c", "%U %G %a", folder]).stdout.split() == ["root", "alice", "750"]
    assert bed.run(["ls", "-A", folder]).stdout.split() == ["broker.sock", "proxy.sock"]
    st = bed.run(["stat", "-c", "%F %U %a", f"{folder}/broker.sock"]).stdout.strip()
    assert st == "socket alice 600", st


def ended(bed: Testbed, ids: set[str]) -> bool:
    rows = json.loads(lev(bed, "ps", "--all", "--json").stdout)
    return all(r["state"] != "running" for r in rows if r["id"] in ids)


def test_a_racing_user_never_gets_root_to_touch_a_root_file(bed: Testbed) -> None:
    targets = [VICTIM, CONFIG_PATH]
    before = {t: facts(bed, t) for t in targets}
    assert all(f.startswith("regular file 0:0") for f in before.values()), before
    # One agent first, so the agents folder exists for the racer to watch.
    first = lev(bed, "run", "--detach", "--", "sleep", "0.2").stdout.strip()
    bed.run(["rm", "-f", STOP])
    racer = subprocess.Popen(bed.command([RACER, "240", STOP, AGENTS, *targets], user="alice"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started: set[str] = {first}
    try:
        time.sleep(0.5)
        for rnd in range(3):
            long = [lev(bed, "run", "--detach", "--", "sleep", "120").stdout.strip()
                    for _ in range(4)]
            short = [lev(bed, "run", "--detach", "--", "sleep", "0.3").stdout.strip()
                     for _ in range(12)]
            started.update(long, short)
            if rnd < 2:
                # Their folders exist when the daemon comes back and binds its
                # sockets again; in the first round they are alice's, as an
                # older daemon left them, with her links and folders planted.
                if rnd == 0:
                    for agent_id in long:
                        plant(bed, f"{AGENTS}/{agent_id}")
                bed.run(["systemctl", "restart", "leviathd"], timeout=90)
                time.sleep(1.5)
                for agent_id in long:
                    assert_root_folder(bed, f"{AGENTS}/{agent_id}")
            for agent_id in long:
                lev(bed, "stop", agent_id, check=False)
        deadline = time.monotonic() + 60
        while not ended(bed, started) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        bed.run(["touch", STOP])
        out, err = racer.communicate(timeout=30)
        bed.run(["rm", "-f", STOP])
    after = {t: facts(bed, t) for t in targets}
    print(f"racer: {out.strip()} {err.strip()}; agents: {len(started)}")
    assert len(started) >= 49
    assert "tries=" in out and int(out.split("tries=")[1]) > 0, (out, err)
    assert after == before, f"root touched a file through alice's symlink ({out.strip()})"
    assert bed.run(["systemctl", "is-active", "leviathd"]).stdout.strip() == "active"
