"""A run's frozen tensors (a LoRA base, a frozen backbone) written once beside its checkpoints, not in each one.

Frozen tensors never change during a fit (:mod:`~fl_lightning.server.federated_parameters`), so every round
checkpoint would repeat them: for a LoRA fine-tune that is the whole base model each round against an adapter
of a few hundred kilobytes. The loop records in each checkpoint a :class:`FrozenReference` (the frozen
``state_dict`` names and a digest of their values, computed once per fit); :class:`CheckedCheckpointIO
<fl_lightning.checkpointing.checkpoint_io.CheckedCheckpointIO>` then writes those tensors once per folder, as
``frozen-<digest>.pt`` beside the checkpoint, leaves them out of the checkpoint file, and puts them back when
a checkpoint is read (resume, ``trainer.test(ckpt_path=...)``, :func:`read_checkpoint
<fl_lightning.checkpointing.checkpoint_io.read_checkpoint>`), after checking the digest. A checkpoint copied
elsewhere needs its ``frozen-<digest>.pt`` beside it; a missing or altered base file is one error naming it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any, TypedDict

import torch
from torch import Tensor

#: Where the loop's state records the reference, inside ``checkpoint["loops"]["fit_loop"]["state_dict"]``.
ENTRY = "frozen_base"


class FrozenReference(TypedDict):
    """The frozen tensors a checkpoint leaves out: every ``state_dict`` name (aliases included) and their digest."""

    names: list[str]
    digest: str


def frozen_digest(tensors: Mapping[str, Tensor]) -> str:
    """A BLAKE2b digest (16 hex digits) of ``tensors``' names, dtypes, shapes and bytes, in name order."""
    digest = hashlib.blake2b(digest_size=8)
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def base_path(checkpoint_path: str | os.PathLike[str], digest: str) -> str:
    """The base file beside ``checkpoint_path``."""
    return os.path.join(os.path.dirname(os.path.abspath(checkpoint_path)), f"frozen-{digest}.pt")


def reference_of(checkpoint: Mapping[str, Any]) -> FrozenReference | None:
    """The checkpoint's :class:`FrozenReference`, or ``None`` (no frozen tensors, or another kind of checkpoint)."""
    loop_state = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
    federated = loop_state.get("federated") if isinstance(loop_state, Mapping) else None
    return federated.get(ENTRY) if isinstance(federated, Mapping) else None


def split_frozen(checkpoint: dict[str, Any], reference: FrozenReference) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``checkpoint`` without the frozen tensors (in its ``state_dict`` and a mid-round client's ``client_state``),
    and the frozen tensors by name. ``checkpoint`` itself is left as it is."""
    names = set(reference["names"])
    frozen = {name: t for name, t in checkpoint["state_dict"].items() if name in names}
    stripped = {**checkpoint, "state_dict": {n: t for n, t in checkpoint["state_dict"].items() if n not in names}}
    loops = checkpoint["loops"]
    fit_loop = loops["fit_loop"]
    federated = dict(fit_loop["state_dict"]["federated"])
    if "client_state" in federated:
        federated["client_state"] = {n: t for n, t in federated["client_state"].items() if n not in names}
    stripped["loops"] = {**loops, "fit_loop": {**fit_loop, "state_dict": {**fit_loop["state_dict"], "federated": federated}}}
    return stripped, frozen
