"""The sandbox's front door (sandbox/launchers.py): every kind has its entry,
and what the held child is given for an agent's steps is what it was given
before the table (the namespace fence's sealed dash, init, scratch image and
hold socket; the dash beside a one-step kind-none agent)."""

from __future__ import annotations

import pytest

from leviathd.domain.sandbox import SandboxKind
from leviathd.sandbox.launchers import LAUNCHERS, HeldNeeds, held_needs, launcher

NS, CT, NONE = SandboxKind.NAMESPACE, SandboxKind.CONTAINER, SandboxKind.NONE
EVERYTHING = HeldNeeds(shell=True, init=True, scratch_image=True, fence_hold=True)


def test_every_kind_has_one_entry_under_its_own_name() -> None:
    assert set(LAUNCHERS) == set(SandboxKind)
    assert all(entry.kind is kind for kind, entry in LAUNCHERS.items())
    # Recorded specs spell the kind as text.
    assert launcher("namespace") is LAUNCHERS[NS]


@pytest.mark.parametrize("kinds, needs", [
    ([NS], EVERYTHING),
    ([NS, CT], EVERYTHING),
    ([CT, NS, NONE], EVERYTHING),
    ([NONE], HeldNeeds(shell=True)),
    ([NONE, NONE], HeldNeeds()),
    ([NONE, CT], HeldNeeds()),
    ([CT], HeldNeeds()),
])
def test_the_held_child_gets_what_the_kinds_need(
    kinds: list[SandboxKind], needs: HeldNeeds,
) -> None:
    assert held_needs(kinds) == needs


def test_only_fenced_kinds_have_a_mount_table_and_only_some_run_tools() -> None:
    assert {k for k, e in LAUNCHERS.items() if e.fenced} == {NS, CT}
    assert {k for k, e in LAUNCHERS.items() if e.tools} == {NS, NONE}
    assert {k for k, e in LAUNCHERS.items() if e.join is not None} == {NS}
    assert {k for k, e in LAUNCHERS.items() if e.ensure is not None} == {CT}
