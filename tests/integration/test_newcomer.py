"""A newcomer's first minutes (issue 33 item 7): the README's console block
runs as written for a user who has nothing prepared (no project folder, no
installed agent), as one shell session from her home (a `cd` carries over),
and `lev inspect` run at `/` refuses with the reason `lev run` gives."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import pytest
from test_docs import EXAMPLE_ID, blocks
from testbed import Testbed

USER = "newt"
UID = 27133
MARK = "__leviath_cwd__"


@pytest.fixture(scope="module")
def bed(testbed: Testbed) -> Iterator[Testbed]:
    testbed.write_file("/etc/leviath/config.toml", '[sandbox]\nkind = "namespace"\n')
    testbed.run(["systemctl", "restart", "leviathd"])
    user = testbed.add_user(USER, ("leviath",))
    # A uid of her own: the bed shares the host's kernel, whose per-uid key
    # quota (each agent joins a fresh session keyring) other beds' users of
    # the usual uids may have used up meanwhile (seen: EDQUOT at the start).
    testbed.run(["usermod", "-u", str(UID), USER])
    testbed.users[USER] = dataclasses.replace(user, uid=UID)
    try:
        yield testbed
    finally:
        import json

        ps = testbed.run(["lev", "ps", "--json"], user=USER, check=False).stdout
        for agent in json.loads(ps or "[]"):
            testbed.run(["lev", "stop", agent["id"]], user=USER, check=False)
        testbed.run(["userdel", "-r", "-f", USER], check=False)
        testbed.users.pop(USER, None)


def test_the_readme_block_runs_as_written_for_a_newcomer(bed: Testbed) -> None:
    (readme,) = [b for b in blocks() if b.where.startswith("README.md")]
    cwd = bed.users[USER].home
    agent_id = ""
    for _user, command in readme.commands:
        line = command.replace(EXAMPLE_ID, agent_id) if agent_id else command
        r = bed.run(f"{line}\nrc=$?; echo; echo {MARK}$PWD; exit $rc", user=USER, cwd=cwd,
                    check=False, timeout=120)
        out, _, where = r.stdout.rpartition(MARK)
        assert r.returncode == 0, (f"README: `$ {command}` in {cwd} exited {r.returncode}\n"
                                   f"stdout: {out}\nstderr: {r.stderr}")
        cwd = where.strip() or cwd
        if re.match(r"lev run (.* )?(--detach|-d)\b", line):
            agent_id = out.strip().splitlines()[-1]
        if line.startswith("lev ps --all"):
            # The attached runs ended: listed with --all (and not without).
            assert re.search(r"\breviewer\s+exited\b", out), out
    assert agent_id, "the README's block starts no detached agent"
    bed.run(["lev", "stop", agent_id], user=USER, check=False)


def test_lev_inspect_at_the_root_gives_the_reason_lev_run_gives(bed: Testbed) -> None:
    bed.run("mkdir -p ~/bp && printf '[agent]\\nname = \"x\"\\ncommand = [\"true\"]\\n' "
            "> ~/bp/blueprint.toml", user=USER)
    home = bed.users[USER].home
    run = bed.run(["lev", "run", f"{home}/bp"], user=USER, cwd="/", check=False)
    inspect = bed.run(["lev", "inspect", f"{home}/bp"], user=USER, cwd="/", check=False)
    assert run.returncode != 0 and inspect.returncode != 0
    reason = "workdir /: a system folder cannot be an agent's workdir"
    assert reason in run.stderr, run.stderr
    assert reason in inspect.stderr, inspect.stderr
