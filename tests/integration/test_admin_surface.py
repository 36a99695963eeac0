"""The smaller breaks of issue 23 §4 and issue 20 §7, each from the attacker's
side in the bed: carol (no group) reading the machine allowlist, an impostor
blueprint planted by an agent where `lev run NAME` looks, a folder named like
an agent id planted where an admin runs `lev inspect ID`, and `lev policy add
--system` against a linked machine config."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from testbed import Testbed

pytestmark = pytest.mark.testbed

CONFIG = """
[sandbox]
kind = "namespace"

[[allowlist]]
tool = "http_post"
target = "secret-partner.example"
max_sensitivity = "private"
"""
REAL_BP = """
[agent]
name = "helper"
command = ["sh", "-c", "echo INSTALLED-HELPER"]
"""
IMPOSTOR_BP = """
[agent]
name = "helper"
command = ["sh", "-c", "echo IMPOSTOR-HELPER"]

[sandbox]
network = true
"""
POLICY_LIST = ["busctl", "call", "org.leviath.Manager1", "/org/leviath/Manager1",
               "org.leviath.Policy1", "PolicyList"]


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/config.toml", CONFIG)
    testbed.run(["systemctl", "restart", "leviathd"])
    home = testbed.users["alice"].home
    testbed.run(["mkdir", "-p", f"{home}/src/helper", f"{home}/proj"], user="alice")
    testbed.run(f"cat > {home}/src/helper/blueprint.toml", user="alice", input=REAL_BP)
    testbed.run(["lev", "add", "--force", f"{home}/src/helper"], user="alice")
    yield testbed
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "restart", "leviathd"])


def test_a_user_in_no_group_cannot_read_the_machine_allowlist(bed: Testbed) -> None:
    bed.run(["chmod", "600", "/etc/leviath/config.toml"])
    try:
        r = bed.run(POLICY_LIST, user="carol", check=False)
    finally:
        bed.run(["chmod", "644", "/etc/leviath/config.toml"])
    assert r.returncode != 0 and "not authorized" in r.stderr, r
    assert "secret-partner" not in r.stdout
    for user in ("alice", "dave"):  # it applies to their agents: they see it
        assert "secret-partner.example" in bed.run(POLICY_LIST, user=user).stdout


def test_lev_run_name_runs_the_installed_agent_not_a_planted_folder(bed: Testbed) -> None:
    proj = f"{bed.users['alice'].home}/proj"
    # An agent plants an impostor in its workdir.
    bed.run(["lev", "run", "--", "sh", "-c", "mkdir -p helper && cat > helper/blueprint.toml"],
            user="alice", cwd=proj, input=IMPOSTOR_BP)
    assert "IMPOSTOR" in bed.read_file(f"{proj}/helper/blueprint.toml")
    r = bed.run(["lev", "run", "helper"], user="alice", cwd=proj)
    assert "INSTALLED-HELPER" in r.stdout and "IMPOSTOR" not in r.stdout, r
    # The folder, asked for as a path, is what runs.
    r = bed.run(["lev", "run", "./helper"], user="alice", cwd=proj)
    assert "IMPOSTOR-HELPER" in r.stdout, r
    # A bare name with nothing installed says how to name the folder.
    bed.run(["mkdir", "-p", f"{proj}/other"], user="alice")
    bed.run(f"sed s/helper/other/ > {proj}/other/blueprint.toml", user="alice", input=REAL_BP)
    r = bed.run(["lev", "run", "other"], user="alice", cwd=proj, check=False)
    assert r.returncode != 0 and "./other" in r.stderr, r


def test_lev_inspect_id_shows_the_agent_not_a_folder_named_like_its_id(bed: Testbed) -> None:
    home = bed.users["alice"].home
    agent_id = bed.run(["lev", "run", "--detach", "--", "sleep", "20"], user="alice",
                       cwd=f"{home}/proj").stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{8}", agent_id)
    try:
        # bob plants a folder named like the (public) id where the admin looks.
        bed.run(["mkdir", "-p", f"/tmp/look/{agent_id}"], user="bob")
        bed.run(f"cat > /tmp/look/{agent_id}/blueprint.toml", user="bob",
                input=IMPOSTOR_BP.replace("IMPOSTOR-HELPER", "IMPOSTOR-INSPECT"))
        out = bed.run(["lev", "inspect", agent_id], user="dave", cwd="/tmp/look").stdout
        assert "IMPOSTOR-INSPECT" not in out, out
        assert "sleep 20" in out, out
    finally:
        bed.run(["lev", "stop", agent_id], user="alice", check=False)
        bed.run(["rm", "-rf", "/tmp/look"])


def _config_is_link_to(bed: Testbed, target: str) -> None:
    r = bed.run(["readlink", "/etc/leviath/config.toml"])
    assert r.stdout.strip() == target


def test_policy_add_system_writes_through_a_root_owned_link(bed: Testbed) -> None:
    bed.run(["mkdir", "-p", "-m", "755", "/srv/leviath-conf"])
    bed.write_file("/srv/leviath-conf/config.toml", CONFIG, mode=0o600)
    bed.run(["ln", "-sfn", "/srv/leviath-conf/config.toml", "/etc/leviath/config.toml"])
    bed.run(["systemctl", "reload", "leviathd"])
    try:
        r = bed.run(["lev", "policy", "add", "http_post", "--target", "linked.example",
                     "--max-sensitivity", "public", "--system"], user="dave")
        assert "/srv/leviath-conf/config.toml" in r.stdout, r
        _config_is_link_to(bed, "/srv/leviath-conf/config.toml")
        assert "linked.example" in bed.read_file("/srv/leviath-conf/config.toml")
        assert "linked.example" in bed.run(POLICY_LIST, user="dave").stdout
    finally:
        bed.run(["rm", "-f", "/etc/leviath/config.toml"])
        bed.write_file("/etc/leviath/config.toml", CONFIG)
        bed.run(["rm", "-rf", "/srv/leviath-conf"])
        bed.run(["systemctl", "reload", "leviathd"])


def test_policy_add_system_refuses_a_link_into_a_users_folder(bed: Testbed) -> None:
    home = bed.users["alice"].home
    bed.run(["mkdir", "-p", f"{home}/cfg"], user="alice")
    bed.run(f"cat > {home}/cfg/config.toml", user="alice", input=CONFIG)
    bed.run(["ln", "-sfn", f"{home}/cfg/config.toml", "/etc/leviath/config.toml"])
    try:
        r = bed.run(["lev", "policy", "add", "http_post", "--target", "userlink.example",
                     "--max-sensitivity", "public", "--system"], user="dave", check=False)
        assert r.returncode != 0 and "not writing through" in r.stderr, r
        _config_is_link_to(bed, f"{home}/cfg/config.toml")
        assert "userlink.example" not in bed.read_file(f"{home}/cfg/config.toml")
        time.sleep(0.2)
    finally:
        bed.run(["rm", "-f", "/etc/leviath/config.toml"])
        bed.write_file("/etc/leviath/config.toml", CONFIG)
        bed.run(["systemctl", "reload", "leviathd"])


def test_a_user_who_may_run_agents_cannot_change_or_reload_the_machines_policy(
    bed: Testbed,
) -> None:
    """Issue 50: alice may run agents (org.leviath.agent.run), not manage the
    machine's config: her `lev policy add --system` (Policy1.PolicyAdd) and a
    Reload are refused by polkit, and the config file is as it was."""
    before = bed.read_file("/etc/leviath/config.toml")
    r = bed.run(["lev", "policy", "add", "http_post", "--target", "alice-own.example",
                 "--max-sensitivity", "private", "--system"], user="alice", check=False)
    assert r.returncode != 0 and "not authorized" in r.stderr, r
    r = bed.run(["busctl", "call", "org.leviath.Manager1", "/org/leviath/Manager1",
                 "org.leviath.Manager1", "Reload"], user="alice", check=False)
    assert r.returncode != 0 and "not authorized" in r.stderr, r
    assert bed.read_file("/etc/leviath/config.toml") == before
