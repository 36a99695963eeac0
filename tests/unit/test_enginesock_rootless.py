"""leviathd/enginesock/rootless.py's pure parts: who has subordinate ids, and
the places the service is told on its command line."""

from __future__ import annotations

import pytest

from leviathd.enginesock import rootless
from leviathd.identity import UserInfo

ALICE = UserInfo("alice", 1001, 1001, (1001,), "/home/alice")


def test_subordinate_ids_count_by_name_or_uid_and_ignore_others() -> None:
    text = "bob:100000:65536\nalice:165536:1000\n1001:300000:64536\nbroken\nalice:x:5\n"
    assert rootless.subid_count(text, ALICE) == 65536
    assert rootless.subid_count("bob:1:65536\n", ALICE) == 0


def test_preflight_refuses_root() -> None:
    with pytest.raises(rootless.RootlessUnavailable, match="root on the host"):
        rootless.preflight(UserInfo("root", 0, 0, (0,), "/root"))


def test_every_place_is_on_the_command_line() -> None:
    # As the engine's own root shows them (enginesock/engineroot.py).
    argv = rootless.service_argv("/usr/bin/podman")
    flags = dict(zip(argv[1:-3:2], argv[2:-3:2], strict=True))
    assert flags == {"--root": "/.leviath-engine/storage/storage",
                     "--runroot": "/.leviath-engine/run/containers",
                     "--tmpdir": "/.leviath-engine/run/libpod/tmp",
                     "--volumepath": "/.leviath-engine/storage/volumes",
                     "--cgroup-manager": "cgroupfs"}
    assert argv[-3:] == ["system", "service", "--time=0"]
