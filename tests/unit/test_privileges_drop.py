"""Issue 50: sandbox/privileges.py's drop_to_user, in a real child of root:
the user's ids and groups only (none of root's supplementary groups), every
capability set empty (bounding and ambient too), no_new_privs set, and a
session keyring of the user's own."""

from __future__ import annotations

import json
import os

import pytest

from leviathd.sandbox import privileges

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop privileges")

NOBODY = 65534


def _status() -> dict[str, str]:
    with open("/proc/self/status", encoding="ascii") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _dropped(groups: list[int]) -> dict[str, object]:
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        try:
            os.setgroups([0, 4, 27])  # root's own supplementary groups, to be shed
            privileges.drop_to_user(NOBODY, NOBODY, groups, no_new_privs=True)
            st = _status()
            got = {k: st[k].split() for k in ("Uid", "Gid", "Groups", "CapInh", "CapPrm",
                                               "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")}
        except BaseException as exc:  # reported to the parent, which fails the test
            got = {"error": repr(exc)}
        os.write(wfd, json.dumps(got).encode())
        os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        data = r.read()
    os.waitpid(pid, 0)
    return dict(json.loads(data))


def test_the_user_keeps_her_ids_and_groups_and_nothing_of_roots() -> None:
    got = _dropped([NOBODY, 100])
    assert "error" not in got, got
    assert got["Uid"] == [str(NOBODY)] * 4 and got["Gid"] == [str(NOBODY)] * 4, got
    assert sorted(got["Groups"]) == sorted([str(NOBODY), "100"]), got  # type: ignore[arg-type]
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert got[cap] == ["0000000000000000"], (cap, got)
    assert got["NoNewPrivs"] == ["1"], got
