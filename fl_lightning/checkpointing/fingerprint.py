"""A checkpoint's record of the federation it belongs to, checked when a run resumes from it.

Resuming a run with other clients, another partition, another algorithm configuration, other
local work, another model, optimizer, LR schedule or data setting would silently continue a
different experiment. The fingerprint is a flat mapping of ``name -> value``
(:func:`federation_fingerprint` and :func:`training_fingerprint`); a resume whose fingerprint
differs is refused with every difference listed, unless ``FederatedTrainer(allow_resume_changes=True)``
says the change is deliberate. ``max_epochs`` is not part of it: a finished run may be extended.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from fl_lightning.algorithms.shared.algorithm import Algorithm
from fl_lightning.server.federation import Federation
from fl_lightning.robust.update_bounds import UpdateBound
from fl_lightning.utils.init_args import RecordsInitArgs, flat_hparams

_ABSENT = "<absent>"
#: Present in fingerprints that cover the model, optimizer, scheduler and data (:func:`training_fingerprint`).
_VERSION_KEY = "fingerprint_version"
#: Constructor arguments that say where data lives or how it is loaded, not which numbers it gives.
_NOT_NUMERIC = frozenset({"root", "download", "num_workers", "partition_file", "dataloader_kwargs"})
#: A scheduler's progress, restored from the checkpoint, rather than its settings.
_SCHEDULER_PROGRESS = frozenset({"last_epoch", "base_lrs"})


class ResumeMismatchError(ValueError):
    """The checkpoint was written by a different federation than the one resuming from it."""


def federation_fingerprint(
    federation: Federation, algorithm: Algorithm, *, update_bound: UpdateBound | None, reset_optimizer: bool
) -> dict[str, Any]:
    """What must match for a resume to continue the same run: the clients and their data, the
    algorithm's class and constructor arguments (nested, :func:`~fl_lightning.utils.init_args.flat_hparams`),
    the update bound, clients per round, seed, local work, and which tensors are frozen or local."""
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
        **kinds_fingerprint(federation),
    }


def kinds_fingerprint(federation: Federation) -> dict[str, str]:
    """``parameters.frozen`` / ``parameters.local``: the count and a hash of the names of each kind that is not
    empty (a run whose tensors are all shared, every run before the kinds existed, adds nothing)."""
    kinds = federation.kinds
    if kinds is None:
        return {}
    entries = {}
    for kind in ("frozen", "local"):
        names = kinds.of(kind)
        if names:
            entries[f"parameters.{kind}"] = f"{len(names)}:{hashlib.sha256(chr(0).join(names).encode()).hexdigest()[:12]}"
    return entries


def training_fingerprint(trainer: pl.Trainer) -> dict[str, Any]:
    """What else changes the numbers: the module's class and saved hyper-parameters (its ``__init__``
    arguments, ``model.lr``, ...), each optimizer's class and parameter-group settings, each LR
    scheduler's class and settings, and the datamodule's constructor arguments (those that name a
    folder or a loading detail left out).

    Read before the checkpoint's optimizer state is restored, which would overwrite the settings."""
    module = trainer.lightning_module
    hparams = {k: v for k, v in module.hparams.items() if not str(k).startswith("_")}  # LightningCLI's _instantiator
    entries: dict[str, Any] = {_VERSION_KEY: 2, "model": type(module).__qualname__, **flat_hparams("model", hparams)}
    for i, optimizer in enumerate(trainer.optimizers):
        entries[f"optimizer.{i}"] = type(optimizer).__qualname__
        for j, group in enumerate(optimizer.param_groups):
            settings = {k: v for k, v in group.items() if k != "params"}
            entries.update(flat_hparams(f"optimizer.{i}.group.{j}", settings))
    for i, config in enumerate(trainer.lr_scheduler_configs):
        state = config.scheduler.state_dict()
        settings = {k: v for k, v in state.items() if not k.startswith("_") and k not in _SCHEDULER_PROGRESS}
        entries[f"lr_scheduler.{i}"] = type(config.scheduler).__qualname__
        settings.update(interval=config.interval, frequency=config.frequency)
        entries.update(flat_hparams(f"lr_scheduler.{i}", settings))
    data = trainer.datamodule
    if isinstance(data, RecordsInitArgs):
        numeric = flat_hparams("data", data)
        entries.update({k: v for k, v in numeric.items() if not _NOT_NUMERIC.intersection(k.split("."))})
    return entries


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
    if _VERSION_KEY not in saved:
        rank_zero_warn(
            f"Checkpoint {path} was written by an older fl_lightning: resuming without checking that its model, "
            "optimizer, LR scheduler and data settings match this run's."
        )
        now = {name: value for name, value in now.items() if name in saved}
    differences = fingerprint_differences(saved, now)
    if not differences:
        return
    listing = "\n".join(f"  {line}" for line in differences)
    if allow_changes:
        kept = (
            "\nThe optimizer state restored from the checkpoint keeps its parameter groups' settings: the new "
            "optimizer values above do not apply."
            if any(line.startswith("optimizer.") for line in differences)
            else ""
        )
        rank_zero_warn(f"Resuming from {path} with deliberate changes (allow_resume_changes=True):\n{listing}{kept}")
        return
    raise ResumeMismatchError(
        f"Cannot resume from {path}: it was written by a different federation (saved → now):\n{listing}\n"
        "Resume with the checkpoint's settings, or pass FederatedTrainer(allow_resume_changes=True) "
        "if the change is deliberate."
    )
