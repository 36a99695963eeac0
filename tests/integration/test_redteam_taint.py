"""Red team: taint bypasses through the file labels and the shell tool, from
inside real agents (the bed, config and agent loop of test_taint_exits.py).

Each attack reads data above Internal and then looks at the taint a second
read leaves: an agent whose taint stays below the data's label can send it
out through every exit cleared for that lower label."""

from __future__ import annotations

import pytest
from test_gate_bed import LOOP, Agent, lev
from test_taint_exits import _private, bed  # noqa: F401  (module fixture)
from testbed import Testbed

pytestmark = pytest.mark.testbed


def _agent_in(bed: Testbed, workdir: str) -> Agent:  # noqa: F811
    home = bed.users["alice"].home
    bed.run(f"mkdir -p {workdir}/.req", user="alice")
    bed.run(["sh", "-c", f"cat > {workdir}/loop.sh"], user="alice", input=LOOP)
    out = lev(bed, "alice", "run", "--detach", f"{home}/xbp", cwd=workdir).stdout.strip()
    return Agent(bed, "alice", out, workdir)


def test_a_label_written_below_the_workdir_reaches_an_agent_working_there(
    bed: Testbed,  # noqa: F811
) -> None:
    """alice's first agent, Private, writes the granted text into a subfolder
    of its workdir (the mark goes on its workdir only). A second agent started
    in that subfolder cats the file with its shell: its output must be Private,
    not Internal."""
    xw = f"{bed.users['alice'].home}/xw"
    sub = f"{xw}/rtsub"
    first = _agent_in(bed, xw)
    second: Agent | None = None
    try:
        _private(first, bed)
        bed.run(["mkdir", "-p", sub], user="alice")
        rc, _out, err = first.call("lev tool write_file rtsub/copied.txt granted-copy")
        assert rc == 0, err
        lev(bed, "alice", "stop", first.id, check=False)
        second = _agent_in(bed, sub)
        assert second.taint() == "public"
        rc, out, err = second.call("lev tool shell cat copied.txt")
        assert rc == 0 and "granted-copy" in out, err
        assert second.taint() == "private"
    finally:
        lev(bed, "alice", "stop", first.id, check=False)
        if second is not None:
            lev(bed, "alice", "stop", second.id, check=False)
        bed.run(["rm", "-rf", sub])
        bed.run(["python3", "-c", f"import os; os.removexattr({xw!r}, 'trusted.leviath.dirty')"],
                check=False)


def test_a_label_written_in_a_workdir_reaches_an_agent_working_above_it(
    bed: Testbed,  # noqa: F811
) -> None:
    """The same, the second agent started in the folder above the first's
    workdir: its shell reads the first one's workdir as a subfolder."""
    home = bed.users["alice"].home
    top = f"{home}/rttop"
    inner = f"{top}/inner"
    bed.run(["mkdir", "-p", inner], user="alice")
    first = _agent_in(bed, inner)
    second: Agent | None = None
    try:
        _private(first, bed)
        rc, _out, err = first.call("lev tool write_file copied.txt granted-copy")
        assert rc == 0, err
        lev(bed, "alice", "stop", first.id, check=False)
        second = _agent_in(bed, top)
        assert second.taint() == "public"
        rc, out, err = second.call("lev tool shell cat inner/copied.txt")
        assert rc == 0 and "granted-copy" in out, err
        assert second.taint() == "private"
    finally:
        lev(bed, "alice", "stop", first.id, check=False)
        if second is not None:
            lev(bed, "alice", "stop", second.id, check=False)
        bed.run(["rm", "-rf", top])


def test_the_shell_reading_a_granted_file_is_private(bed: Testbed) -> None:  # noqa: F811
    """read_file of a granted path outside the workdir is Private; the shell
    must not read it at a lower label."""
    xw = f"{bed.users['alice'].home}/xw"
    a = _agent_in(bed, xw)
    try:
        assert a.taint() == "public"
        rc, out, err = a.call(f"lev tool shell cat {bed.users['alice'].home}/shared/doc.txt")
        assert rc == 0, err
        # Held when written: the shell's fence does not mount the grant.
        assert "granted text" not in out or a.taint() == "private", out
    finally:
        lev(bed, "alice", "stop", a.id, check=False)
