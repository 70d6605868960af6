"""Reading a checkpoint file as a test edits it: with its client-store entries inline."""

from __future__ import annotations

import os
from typing import Any

import torch

from fl_lightning.checkpointing.client_shards import resolve_shards


def load_checkpoint_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``torch.load`` of the checkpoint at ``path``, with the client-store entries it references in the shard files beside
    it put back (``{"entries": ...}``), so that a test can edit them and ``torch.save`` the result anywhere, inline."""
    return resolve_shards(torch.load(path, weights_only=False), path)
