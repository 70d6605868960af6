"""Suite-wide settings."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(autouse=True, scope="session")
def one_thread_per_worker():
    """One intra-op thread per test process: pytest-xdist already runs one process per core,
    and torch's extra threads on tiny tensors only contend (a 16x10 cross-entropy took ~5 ms
    with 2 threads on a loaded 2-core machine, ~5 us with 1)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
