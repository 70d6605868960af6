"""A checkpoint's record of the federation it belongs to, checked when a run resumes from it.

Resuming a run with other clients, another partition, another algorithm configuration or other
local work would silently continue a different experiment. The fingerprint is a flat mapping of
``name -> value``; a resume whose fingerprint differs is refused with every difference listed,
unless ``FederatedTrainer(allow_resume_changes=True)`` says the change is deliberate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from fl_lightning.algorithms.shared.base import Algorithm
from fl_lightning.federation import Federation
from fl_lightning.update_bounds import UpdateBound
from fl_lightning.utils.init_args import flat_hparams

_ABSENT = "<absent>"


class ResumeMismatchError(ValueError):
    """The checkpoint was written by a different federation than the one resuming from it."""


def federation_fingerprint(
    federation: Federation, algorithm: Algorithm, *, update_bound: UpdateBound | None, reset_optimizer: bool
) -> dict[str, Any]:
    """What must match for a resume to continue the same run: the clients and their data, the
    algorithm's class and constructor arguments (nested, :func:`~fl_lightning.utils.init_args.flat_hparams`),
    the update bound, clients per round, seed and local work."""
    return {
        "num_clients": federation.num_clients,
        "partition": partition_hash(federation),
        "clients_per_round": federation.clients_per_round,
        "seed": federation.seed,
        "local_epochs": federation.local_epochs,
        "local_steps": federation.local_steps,
        "reset_optimizer": reset_optimizer,
        **flat_hparams("algorithm", algorithm),
        **flat_hparams("update_bound", update_bound),
    }


def partition_hash(federation: Federation) -> str:
    """A hash of every client's training-sample indices (``"indices:..."``) when the data provides
    them (``client_indices(cid)``, as :class:`~fl_lightning.data.FederatedDataModule` does), else of
    the clients' sample counts (``"sizes:..."``)."""
    digest = hashlib.sha256()
    client_indices = getattr(federation.data, "client_indices", None)
    if callable(client_indices):
        for cid in range(federation.num_clients):
            indices = np.ascontiguousarray(client_indices(cid), dtype=np.int64)
            digest.update(np.int64(len(indices)).tobytes())
            digest.update(indices.tobytes())
        return f"indices:{digest.hexdigest()[:16]}"
    digest.update(np.ascontiguousarray(federation.num_samples, dtype=np.int64).tobytes())
    return f"sizes:{digest.hexdigest()[:16]}"


def fingerprint_differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """One ``"name: saved → now"`` line per entry that differs (an entry only one side has shows as absent)."""
    names = [*now, *(name for name in saved if name not in now)]
    return [
        f"{name}: {saved.get(name, _ABSENT)!r} → {now.get(name, _ABSENT)!r}"
        for name in names
        if saved.get(name, _ABSENT) != now.get(name, _ABSENT)
    ]


def check_resume(saved: Mapping[str, Any] | None, now: Mapping[str, Any], *, path: Any, allow_changes: bool) -> None:
    """Refuses a resume from checkpoint ``path`` whose fingerprint ``saved`` differs from ``now``.

    Raises:
        ResumeMismatchError: listing every difference, unless ``allow_changes`` (then a warning lists them).
    """
    if saved is None:
        rank_zero_warn(
            f"Checkpoint {path} has no federation fingerprint (written by an older fl_lightning): resuming "
            "without checking that its clients, partition and algorithm match this run's."
        )
        return
    differences = fingerprint_differences(saved, now)
    if not differences:
        return
    listing = "\n".join(f"  {line}" for line in differences)
    if allow_changes:
        rank_zero_warn(f"Resuming from {path} with deliberate changes (allow_resume_changes=True):\n{listing}")
        return
    raise ResumeMismatchError(
        f"Cannot resume from {path}: it was written by a different federation (saved → now):\n{listing}\n"
        "Resume with the checkpoint's settings, or pass FederatedTrainer(allow_resume_changes=True) "
        "if the change is deliberate."
    )
