"""leviathd/enginesock/rootless.py's pure parts: who has subordinate ids, and
the places the service is told on its command line."""

from __future__ import annotations

from pathlib import Path

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


def test_the_engine_is_never_attached_to_a_scope_that_is_not_the_agents() -> None:
    """attach() reads the scope from the agent's supervisor: a supervisor
    outside the named unit is refused before any cgroup file is written."""
    import os

    with pytest.raises(OSError, match="is not in"):
        rootless.attach(os.getpid(), "leviath-alice-x-0123abcd.scope", os.getpid())


def test_the_api_socket_is_roots_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import stat

    from leviathd.enginesock import engine

    if os.geteuid() != 0:
        pytest.skip("needs root: the socket is made root's")
    monkeypatch.setattr(engine, "service_dir", lambda: str(tmp_path / "engine"))
    sock = rootless.bind("0123abcd")
    try:
        st = os.stat(tmp_path / "engine" / rootless.socket_name("0123abcd"))
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0
        assert stat.S_IMODE(os.stat(tmp_path / "engine").st_mode) == 0o700
    finally:
        sock.close()


def test_a_negative_start_grants_no_subordinate_ids() -> None:
    assert rootless.subid_count("alice:-1:65536\n", ALICE) == 0
