"""No full garbage collection of the set-up's objects inside the round loop.

CPython's full (generation-2) collection walks every tracked object. After imports and the Trainer's set-up a
process holds hundreds of thousands of them (530k with Lightning, torchmetrics and a framework next to it), so a
full collection that falls inside a round costs 0.3 s, the time of dozens of rounds of a small model. The
objects alive when the rounds start live as long as the fit: :func:`frozen_heap` moves them into the collector's
permanent generation (:func:`gc.freeze`) for the fit, so a collection walks only what the rounds allocated.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freezes every object tracked now for the block; unfreezes after it unless something froze objects before
    (the user, or an enclosing fit), whose choice stays. Garbage already in the heap waits until then."""
    frozen_before = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()
