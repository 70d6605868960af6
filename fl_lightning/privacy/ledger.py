"""What a differentially private run has released: the mechanisms' settings in order, with counts.

ε composes what was released. A run resumed with another noise multiplier (``allow_resume_changes``)
keeps the rounds it released at the old one and adds new ones at the new one; recomputing every
past round at the new setting would under-report ε (or let it go backwards).
"""

from __future__ import annotations

import math
from typing import Any

from fl_lightning.utils.saved_state import InvalidStateError

#: A mechanism's parameters (the noise multiplier first) and how many times it was released, in order.
Entries = tuple[tuple[tuple[float, ...], int], ...]


def check_count(name: str, value: Any) -> int:
    """``value``, checked to be an integer ``>= 0``; else a ValueError naming the entry ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"`{name}` must be an integer >= 0, got {value!r}.")
    return value


class Ledger:
    """Runs of ``(setting, count)`` in release order; a setting is a tuple of numbers, its noise multiplier first."""

    def __init__(self, entries: Entries = ()) -> None:
        self.entries: list[tuple[tuple[float, ...], int]] = list(entries)

    @property
    def total(self) -> int:
        """Releases of every setting."""
        return sum(count for _, count in self.entries)

    def spend(self, setting: tuple[float, ...], count: int = 1) -> None:
        """Records ``count`` more releases at ``setting`` (the last run grows if it has the same setting)."""
        if self.entries and self.entries[-1][0] == setting:
            self.entries[-1] = (setting, self.entries[-1][1] + count)
        else:
            self.entries.append((setting, count))

    def with_more(self, setting: tuple[float, ...], count: int = 1) -> Entries:
        """The entries as they would be after ``count`` more releases at ``setting`` (for a budget check)."""
        ahead = Ledger(tuple(self.entries))
        ahead.spend(setting, count)
        return tuple(ahead.entries)

    def state_dict(self) -> list[list[Any]]:
        return [[list(setting), count] for setting, count in self.entries]

    @classmethod
    def from_state(cls, state: Any, name: str, width: int) -> Ledger:
        """A ledger from :meth:`state_dict`'s form, every entry checked: ``width`` finite numbers ``>= 0``
        and a count ``>= 0``; else a ValueError naming the entry ``name`` and what is allowed."""
        allowed = f"a list of [[{width} finite numbers >= 0], count >= 0] pairs"
        if not isinstance(state, (list, tuple)):
            raise ValueError(f"`{name}` must be {allowed}, got {state!r}.")
        entries = []
        for entry in state:
            try:
                setting, count = entry
                setting = tuple(float(v) for v in setting)
            except (TypeError, ValueError):
                raise ValueError(f"`{name}` must be {allowed}, got the entry {entry!r}.") from None
            bad_count = isinstance(count, bool) or not isinstance(count, int) or count < 0
            if bad_count or len(setting) != width or not all(math.isfinite(v) and v >= 0 for v in setting):
                raise ValueError(f"`{name}` must be {allowed}, got the entry {entry!r}.")
            entries.append((setting, count))
        return cls(tuple(entries))


def check_released(releases: int, rounds_done: int) -> None:
    """Raises :class:`~fl_lightning.utils.saved_state.InvalidStateError` when a checkpoint's ledger records more
    ``releases`` than its ``rounds_done`` rounds (aggregations): one release per round at most (fewer where a round
    was rolled back or the budget was spent)."""
    if releases > rounds_done:
        raise InvalidStateError(
            f"the privacy ledger `spent` records {releases} releases, but the checkpoint has only {rounds_done} rounds done."
        )
