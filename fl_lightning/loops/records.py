"""The loops' append-only records in a checkpoint: the last :data:`RECORDS_KEPT`, so its size stays bounded.

The client history (one entry per round or aggregation) and the asynchronous loop's arrivals (one per
arrival) are a trace of the run for the user to read; no number of a later round depends on them. A
checkpoint that held them whole would grow with every round (about 120 B per aggregation of FedBuff,
2.4 MB at 20,000) and be rewritten whole every round. It keeps the newest :data:`RECORDS_KEPT` of each
and the index of the first kept one, so a resumed run's records are the saved ones and what it adds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

#: Records of each kind a checkpoint keeps (the newest).
RECORDS_KEPT = 1_000


def kept_records(records: Sequence[T], start: int) -> tuple[list[T], int]:
    """The newest :data:`RECORDS_KEPT` of ``records`` (whose first is record number ``start``) and the number of
    the first of them."""
    kept = list(records[len(records) - min(len(records), RECORDS_KEPT) :])
    return kept, start + len(records) - len(kept)
