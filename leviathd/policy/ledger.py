"""The taint ledger of one agent: labelled entries for the data it has taken
in, oldest evicted past a budget. Taint is the highest label still live."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from leviathd.domain.sensitivity import Sensitivity
from leviathd.errors import InvalidArgument


@dataclass(frozen=True)
class Entry:
    id: int
    tool: str
    target: str
    label: Sensitivity
    at: float


class Ledger:
    """Entries are immutable and the only ways out are eviction by budget or
    the agent reporting that it dropped an entry from its context. There is no
    way to change a label: an agent may forget data, never launder it."""

    def __init__(self, budget: int) -> None:
        if budget < 1:
            raise InvalidArgument(f"taint budget must be at least 1, got {budget}")
        self._budget = budget
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self._counts = [0, 0, 0]  # live entries per Sensitivity value
        self._next_id = 1

    @classmethod
    def restore(cls, budget: int, entries: Iterable[Entry]) -> Ledger:
        """A ledger holding `entries` (oldest first) with their ids and labels,
        as saved by the daemon: taint survives a daemon restart."""
        ledger = cls(budget)
        for entry in entries:
            ledger._entries[entry.id] = entry
            ledger._counts[entry.label] += 1
            ledger._next_id = max(ledger._next_id, entry.id + 1)
        ledger._evict_over_budget()
        return ledger

    @property
    def budget(self) -> int:
        return self._budget

    def set_budget(self, budget: int) -> None:
        if budget < 1:
            raise InvalidArgument(f"taint budget must be at least 1, got {budget}")
        self._budget = budget
        self._evict_over_budget()

    @property
    def taint(self) -> Sensitivity:
        for level in (Sensitivity.PRIVATE, Sensitivity.INTERNAL):
            if self._counts[level]:
                return level
        return Sensitivity.PUBLIC

    def add(self, tool: str, target: str, label: Sensitivity) -> Entry:
        entry = Entry(self._next_id, tool, target, label, time.time())
        self._next_id += 1
        self._entries[entry.id] = entry
        self._counts[label] += 1
        self._evict_over_budget()
        return entry

    def drop(self, ids: Iterable[int]) -> list[int]:
        """The agent reports entries it no longer holds. Unknown or already
        evicted ids are ignored; returns the ids actually dropped."""
        dropped = []
        for entry_id in ids:
            entry = self._entries.pop(entry_id, None)
            if entry is not None:
                self._counts[entry.label] -= 1
                dropped.append(entry_id)
        return dropped

    def entries(self) -> tuple[Entry, ...]:
        return tuple(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def _evict_over_budget(self) -> None:
        while len(self._entries) > self._budget:
            _, oldest = self._entries.popitem(last=False)
            self._counts[oldest.label] -= 1
