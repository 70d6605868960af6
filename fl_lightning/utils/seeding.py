"""Deterministic seeds derived from ``(seed, purpose, round, client, ...)``.

Every random choice in fl_lightning draws from a generator seeded by :func:`derive_seed`, so
that a run is reproducible from its seed alone, whatever the order in which clients are
processed or how they are spread over processes.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch


def _as_int(key: int | str) -> int:
    # crc32 rather than hash(): Python salts str hashes per process.
    return zlib.crc32(key.encode()) if isinstance(key, str) else int(key)


def derive_seed(seed: int, *keys: int | str) -> int:
    """Returns a 63-bit seed that depends only on ``seed`` and ``keys``.

    >>> derive_seed(0, "select", 3) == derive_seed(0, "select", 3)
    True
    >>> derive_seed(0, "select", 3) != derive_seed(0, "select", 4)
    True
    """
    values = [_as_int(seed), *(_as_int(k) for k in keys)]
    if any(not 0 <= v < 2**64 for v in values):
        raise ValueError(f"Seeds and seed keys must be in [0, 2**64), got {values}.")
    # Length first and two fixed 32-bit words per value: SeedSequence would otherwise pad
    # short inputs with zeros, so (s, "a") and (s, "a", 0) would share a stream.
    entropy = [len(values)] + [word for v in values for word in (v >> 32, v & 0xFFFFFFFF)]
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def make_generator(seed: int, *keys: int | str) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``derive_seed(seed, *keys)``."""
    return torch.Generator().manual_seed(derive_seed(seed, *keys))
