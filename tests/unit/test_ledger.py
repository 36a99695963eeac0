from __future__ import annotations

import dataclasses

import pytest

from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import InvalidArgument
from leviathd.policy.ledger import Ledger

P, N, X = Sensitivity.PUBLIC, Sensitivity.INTERNAL, Sensitivity.PRIVATE


def test_an_empty_ledger_is_public() -> None:
    assert Ledger(4).taint is P


def test_taint_is_the_highest_live_label() -> None:
    ledger = Ledger(10)
    ledger.add("web_fetch", "a", P)
    ledger.add("read_file", "b", N)
    assert ledger.taint is N
    ledger.add("credential", "c", X)
    ledger.add("web_fetch", "d", P)
    assert ledger.taint is X


def test_the_oldest_entries_are_evicted_past_the_budget_and_taint_recovers() -> None:
    ledger = Ledger(2)
    secret = ledger.add("read_file", "secret", X)
    ledger.add("web_fetch", "a", P)
    assert ledger.taint is X
    ledger.add("web_fetch", "b", P)
    assert secret.id not in [e.id for e in ledger.entries()]
    assert len(ledger) == 2
    assert ledger.taint is P


def test_the_agent_may_report_its_own_evictions_by_id() -> None:
    ledger = Ledger(10)
    secret = ledger.add("read_file", "secret", X)
    ledger.add("read_file", "code", N)
    assert ledger.drop([secret.id, 999]) == [secret.id]
    assert ledger.taint is N
    assert ledger.drop([secret.id]) == []  # twice is harmless


def test_an_entry_cannot_be_relabelled() -> None:
    entry = Ledger(2).add("read_file", "secret", X)
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.label = P  # type: ignore[misc]
    assert not any(name.startswith(("relabel", "set_label")) for name in dir(Ledger))


def test_a_smaller_budget_evicts_at_once() -> None:
    ledger = Ledger(5)
    ledger.add("read_file", "secret", X)
    for i in range(3):
        ledger.add("web_fetch", str(i), P)
    ledger.set_budget(3)
    assert ledger.taint is P


def test_a_budget_below_one_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        Ledger(0)


def test_a_restored_ledger_keeps_ids_labels_and_taint_and_continues_numbering() -> None:
    from leviathd.domain.sensitivity import Sensitivity
    from leviathd.policy.ledger import Ledger

    old = Ledger(3)
    for label in (Sensitivity.PRIVATE, Sensitivity.INTERNAL, Sensitivity.PUBLIC):
        old.add("read_file", "x", label)
    restored = Ledger.restore(3, old.entries())
    assert restored.entries() == old.entries()
    assert restored.taint is Sensitivity.PRIVATE
    assert restored.add("read_file", "y", Sensitivity.PUBLIC).id == 4
    assert restored.taint is Sensitivity.INTERNAL  # the private entry was the oldest
    assert Ledger.restore(1, old.entries()).taint is Sensitivity.PUBLIC  # a smaller budget


@pytest.mark.parametrize("budget", [0, -1])
def test_a_reload_to_a_budget_below_one_is_refused_and_launders_nothing(budget: int) -> None:
    # A budget of 0 would evict every entry at once: the taint of a secret
    # the agent still holds back to public.
    ledger = Ledger(4)
    ledger.add("read_file", "secret", X)
    with pytest.raises(InvalidArgument):
        ledger.set_budget(budget)
    assert ledger.budget == 4 and len(ledger) == 1
    assert ledger.taint is X


def test_a_reload_to_a_budget_of_one_keeps_the_newest_entry() -> None:
    ledger = Ledger(4)
    ledger.add("web_fetch", "a", P)
    ledger.add("read_file", "secret", X)
    ledger.set_budget(1)
    assert ledger.budget == 1
    assert [e.target for e in ledger.entries()] == ["secret"]
    assert ledger.taint is X
