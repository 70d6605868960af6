"""A secure-mode run's durable record of every release, so that no resume re-releases a round unaccounted.

In secure mode a resumed run draws a new secret (:mod:`fl_lightning.privacy.noise`), so a round re-run after a
resume from a checkpoint older than the last released round is a *new* release: fresh noise (and a fresh
sample) on nearly the same clipped sums, which the checkpoint's ledger does not hold. :class:`ReleaseLog` writes
the whole ledger atomically (fsync, rename: :func:`~fl_lightning.checkpointing.checkpoint_io.atomic_save`)
*before* each release is applied to the model, to ``dp_releases_<random>.pt`` in the run's folder; the
checkpoint holds its path, and a resumed run adopts the log's ledger (which extends the checkpoint's) and goes on
writing to it, so every fork of a run is accounted in one ledger. Research mode needs none: a re-run round there
draws the same noise and sample from the seed and releases nothing new.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

import torch

from fl_lightning.checkpointing.checkpoint_io import atomic_save
from fl_lightning.privacy.ledger import Ledger
from fl_lightning.privacy.noise import rank_zero_value


def _rank() -> int:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return torch.distributed.get_rank() if distributed else 0


def extends(longer: Ledger, shorter: Ledger) -> bool:
    """Whether ``longer`` is ``shorter`` with more releases after it (the same runs, the last one at least as long)."""
    if not shorter.entries:
        return True
    *whole, (setting, count) = shorter.entries
    head = longer.entries[: len(whole) + 1]
    return len(head) == len(whole) + 1 and head[:-1] == whole and head[-1][0] == setting and head[-1][1] >= count


class ReleaseLog:
    """The release ledger at :attr:`path` (``None``: no run folder, as outside a fit; nothing is written)."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    @classmethod
    def fresh(cls, folder: str | None) -> ReleaseLog:
        """A new log in ``folder``, named so that no other run's log is overwritten (written at the first release)."""
        return cls(None if folder is None else os.path.join(folder, f"dp_releases_{secrets.token_hex(8)}.pt"))

    def record(self, ledger: Ledger) -> None:
        """Writes ``ledger`` (every release so far, the one about to be applied included) durably; rank 0 writes."""
        if self.path is not None and _rank() == 0:
            atomic_save({"spent": ledger.state_dict()}, self.path)

    def resume(self, saved: Ledger) -> Ledger:
        """The ledger a run resumed from a checkpoint whose ledger is ``saved`` must continue: the log's (rank 0's
        read, broadcast). Raises ValueError, on every rank, when the log is missing, unreadable or another run's."""
        found: Any = self._read(saved) if _rank() == 0 else None
        found = rank_zero_value(found)
        if isinstance(found, str):
            raise ValueError(found)
        return Ledger.from_state(found, "release log", width=3)

    def _read(self, saved: Ledger) -> list[Any] | str:
        """The log's ledger (state form), or the error message."""
        why = (
            "a secure-mode run cannot know whether rounds after the checkpoint were released with other noise; "
            "restore the log at that path to resume"
        )
        try:
            spent = torch.load(self.path, weights_only=True)["spent"]
            log = Ledger.from_state(spent, "release log", width=3)
        except FileNotFoundError:
            return f"The checkpoint's release log {self.path} is missing: {why}."
        except Exception as err:  # noqa: BLE001  # any unreadable or tampered file: one message naming it
            return f"The checkpoint's release log {self.path} cannot be read ({type(err).__name__}: {err}): {why}."
        if not extends(log, saved):
            return (
                f"The release log {self.path} holds {log.total} releases {log.entries}, which do not extend the "
                f"checkpoint's {saved.entries}: the log is another run's; restore this run's log at that path."
            )
        return spent
