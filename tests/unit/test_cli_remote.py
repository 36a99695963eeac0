"""`lev -H` and `-M` (cli/remote.py): the bridge's argv, and what is refused
before ssh starts (an option for a host, a command that passes descriptors)."""

from __future__ import annotations

import pytest

from leviathd.cli import remote


def test_the_bridge_is_systemds_own() -> None:
    assert remote.split(["-H", "alice@build3", "ps", "--json"]) == (
        ["ps", "--json"], ["ssh", "-xT", "--", "alice@build3", "systemd-stdio-bridge"],
        "host alice@build3")
    assert remote.split(["--host=build3", "stop", "0123abcd"])[1] == [
        "ssh", "-xT", "--", "build3", "systemd-stdio-bridge"]
    assert remote.split(["-M", "box", "stats"])[1] == ["systemd-stdio-bridge", "--machine=box"]
    assert remote.split(["ps"]) == (["ps"], None, "")


@pytest.mark.parametrize("argv", [
    ["-H", "-oProxyCommand=sh", "ps"], ["-H", "-v", "ps"], ["-H", "a b", "ps"],
    ["-H", "a;id", "ps"], ["-H", "a@b@c", "ps"], ["-H", "", "ps"], ["-M", "x:y", "ps"],
    ["-H", "h", "run", "--", "true"], ["-H", "h", "logs", "0123abcd"], ["-H"],
    ["--machine=box"],
])
def test_refused_before_anything_starts(argv: list[str]) -> None:
    with pytest.raises(remote.RemoteError):
        remote.split(argv)
