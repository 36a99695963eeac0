"""Which view a file tool's open goes through (broker/tools.py `reader`,
issue 43): writes and reads in the workdir through the agent's own view;
only granted reads beyond the workdir through the host's, where the grants
decide. The bed test (tests/integration/test_broker_view.py) shows both
views at work in a real agent."""

from __future__ import annotations

from typing import cast

from leviathd.broker.opener import Opener
from leviathd.broker.tools import reader

VIEW = cast(Opener, object())
HOST = cast(Opener, object())
WORKDIR = "/home/alice/proj"


def test_reads_in_the_workdir_go_through_the_agents_view() -> None:
    for path in (WORKDIR, f"{WORKDIR}/a.txt", f"{WORKDIR}/.git/config", f"{WORKDIR}/x/../y"):
        assert reader(VIEW, HOST, WORKDIR, path) is VIEW, path


def test_granted_reads_beyond_the_workdir_go_through_the_hosts_view() -> None:
    for path in ("/home/alice/shared/n.txt", f"{WORKDIR}/../other/f", f"{WORKDIR}-x/f"):
        assert reader(VIEW, HOST, WORKDIR, path) is HOST, path


def test_without_a_second_opener_everything_goes_through_the_one() -> None:
    assert reader(VIEW, None, WORKDIR, "/home/alice/shared/n.txt") is VIEW
