"""A checkpoint's record of the federation it belongs to, checked when a run resumes from it.

Resuming a run with other clients, another partition, another algorithm configuration, other
local work, another model, optimizer, LR schedule, data or trainer setting would silently continue a
different experiment. The fingerprint is a flat mapping of ``name -> value``
(:func:`federation_fingerprint`, :func:`settings_fingerprint` and :func:`optimization_fingerprint`); a resume
whose fingerprint differs is refused with every difference listed, unless
``FederatedTrainer(allow_resume_changes=True)`` says the change is deliberate. ``max_epochs`` is not part of
it: a finished run may be extended.

Which ``Trainer`` and ``FederatedTrainer`` arguments are in it is one table: :data:`TRAINER_SETTINGS` and
:data:`FEDERATED_SETTINGS` change the numbers, :data:`NOT_IN_FINGERPRINT` says why each other one does not;
``tests/test_fingerprint_arguments.py`` checks that the three cover both signatures, so a new argument
cannot be forgotten.

Everything but the optimizers' and LR schedulers' settings is checked as soon as the checkpoint is read,
before Lightning loads any of it into the module (a model of another size is one mismatch error, not a
size-mismatch traceback); those two exist only once ``configure_optimizers`` has run, and are checked then,
before the federated state is restored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from enum import Enum
from typing import Any

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from fl_lightning.algorithms.shared.algorithm import Algorithm
from fl_lightning.server.federated_parameters import ParameterKinds
from fl_lightning.server.federation import FederatedDataSource
from fl_lightning.robust.update_bounds import UpdateBound
from fl_lightning.utils.init_args import RecordsInitArgs, flat_hparams

_ABSENT = "<absent>"
#: Present in fingerprints that cover the model, optimizer, scheduler and data (version 2) and the trainer's
#: settings (version 3).
_VERSION_KEY = "fingerprint_version"
_VERSION = 3
#: What a checkpoint of each older fingerprint version was written without.
_UNCHECKED = {
    1: "model, optimizer, LR scheduler, data and trainer settings",
    2: "trainer settings (precision, gradient clipping, accumulation, batch limits)",
}
#: Constructor arguments that say where data lives or how it is loaded, not which numbers it gives.
_NOT_NUMERIC = frozenset({"root", "download", "num_workers", "partition_file", "dataloader_kwargs"})
#: A scheduler's progress, restored from the checkpoint, rather than its settings.
_SCHEDULER_PROGRESS = frozenset({"last_epoch", "base_lrs"})

#: ``Trainer`` arguments that change what a fit computes or reports, recorded as ``trainer.<name>`` with the value
#: the trainer resolved (``precision=32`` is ``"32-true"``; a precision plugin shows as its precision).
TRAINER_SETTINGS = (
    "precision",
    "accumulate_grad_batches",
    "gradient_clip_val",
    "gradient_clip_algorithm",
    "limit_train_batches",
    "overfit_batches",
    "limit_val_batches",  # the validation metrics, which EarlyStopping and ReduceLROnPlateau read
    "check_val_every_n_epoch",  # when they are read
)
#: ``FederatedTrainer`` arguments and the fingerprint entry (or entries under ``<entry>.``) that records each
#: (:func:`federation_fingerprint`; the partition as a hash of every client's sample indices).
FEDERATED_SETTINGS = {
    "algorithm": "algorithm",
    "clients_per_round": "clients_per_round",
    "local_epochs": "local_epochs",
    "local_steps": "local_steps",
    "seed": "seed",
    "num_clients": "num_clients",
    "partitioner": "partition",
    "reset_optimizer": "reset_optimizer",
    "update_bound": "update_bound",
    "federated_parameters": "parameters",  # only where a tensor is frozen or local (kinds_fingerprint)
}
#: Every other ``Trainer`` / ``FederatedTrainer`` argument, and why a resume may change it.
NOT_IN_FINGERPRINT = {
    # When to stop, not what a round computes: a resumed run may be extended, as with max_epochs.
    "max_epochs": "when to stop",
    "min_epochs": "when to stop",
    "max_steps": "when to stop",
    "min_steps": "when to stop",
    "max_time": "when to stop",
    "fast_dev_run": "writes no checkpoint to resume from",
    # Where and on how many processes it runs: N processes give 1's numbers (docs/distributed.md); another
    # accelerator differs by float round-off only, and moving a run to one is a legitimate resume.
    "accelerator": "where it runs",
    "strategy": "where it runs",
    "devices": "where it runs",
    "num_nodes": "where it runs",
    "deterministic": "kernel choice: the same computation, reproducible or not",
    "benchmark": "kernel choice: the same computation",
    "detect_anomaly": "a check, no change to the values",
    "inference_mode": "how evaluation disables autograd, not its values",
    "plugins": "a precision plugin shows as `precision`; environments and IO plugins compute nothing",
    # Output, logging and bookkeeping.
    "logger": "output only",
    "callbacks": "each callback's state is its own, restored from the checkpoint",
    "profiler": "output only",
    "log_every_n_steps": "output only",
    "enable_checkpointing": "output only",
    "enable_progress_bar": "output only",
    "enable_model_summary": "output only",
    "enable_autolog_hparams": "output only",
    "default_root_dir": "output only",
    "model_registry": "output only",
    "num_sanity_val_steps": "its results are discarded",
    "limit_test_batches": "read by test, not fit",
    "limit_predict_batches": "read by predict, not fit",
    # Refused by FederatedTrainer except for one value (fl_lightning.trainer_arguments).
    "val_check_interval": "refused except 1.0",
    "use_distributed_sampler": "refused except False",
    "barebones": "refused except False",
    "sync_batchnorm": "refused except False",
    "reload_dataloaders_every_n_epochs": "refused except 0",
    # FederatedTrainer's own: how clients are executed and stored gives the same weights (docs/executors.md,
    # docs/client_state.md), and the opt-out of this check.
    "client_executor": "the same weights by every executor",
    "max_batched_clients": "the same weights by every executor",
    "compile_batched_steps": "the same weights by every executor",
    "client_state_memory": "spilled client state reads back bit-exact",
    "allow_resume_changes": "the opt-out of this check",
}


class ResumeMismatchError(ValueError):
    """The checkpoint was written by a different federation than the one resuming from it."""


def federation_fingerprint(
    data: FederatedDataSource,
    kinds: ParameterKinds | None,
    algorithm: Algorithm,
    *,
    clients_per_round: int,
    seed: int,
    local_epochs: int | None,
    local_steps: int | None,
    update_bound: UpdateBound | None,
    reset_optimizer: bool,
) -> dict[str, Any]:
    """What must match for a resume to continue the same run: the clients and their data, the
    algorithm's class and constructor arguments (nested, :func:`~fl_lightning.utils.init_args.flat_hparams`),
    the update bound, clients per round (resolved to a count), seed, local work, and which tensors are frozen or local."""
    return {
        "num_clients": data.num_clients,
        "partition": partition_hash(data),
        "clients_per_round": clients_per_round,
        "seed": seed,
        "local_epochs": local_epochs,
        "local_steps": local_steps,
        "reset_optimizer": reset_optimizer,
        **flat_hparams("algorithm", algorithm),
        **flat_hparams("update_bound", update_bound),
        **kinds_fingerprint(kinds),
    }


def kinds_fingerprint(kinds: ParameterKinds | None) -> dict[str, str]:
    """``parameters.frozen`` / ``parameters.local``: the count and a hash of the names of each kind that is not
    empty (a run whose tensors are all shared, every run before the kinds existed, adds nothing)."""
    if kinds is None:
        return {}
    entries = {}
    for kind in ("frozen", "local"):
        names = kinds.of(kind)
        if names:
            entries[f"parameters.{kind}"] = f"{len(names)}:{hashlib.sha256(chr(0).join(names).encode()).hexdigest()[:12]}"
    return entries


def settings_fingerprint(trainer: pl.Trainer) -> dict[str, Any]:
    """What else changes the numbers and is known before a checkpoint is restored: the module's class and saved
    hyper-parameters (its ``__init__`` arguments, ``model.lr``, ...), the datamodule's constructor arguments
    (those that name a folder or a loading detail left out) and the trainer's :data:`TRAINER_SETTINGS`."""
    module = trainer.lightning_module
    hparams = {k: v for k, v in module.hparams.items() if not str(k).startswith("_")}  # LightningCLI's _instantiator
    entries: dict[str, Any] = {_VERSION_KEY: _VERSION, "model": type(module).__qualname__, **flat_hparams("model", hparams)}
    data = trainer.datamodule
    if isinstance(data, RecordsInitArgs):
        numeric = flat_hparams("data", data)
        entries.update({k: v for k, v in numeric.items() if not _NOT_NUMERIC.intersection(k.split("."))})
    for name in TRAINER_SETTINGS:
        value = getattr(trainer, name)
        entries[f"trainer.{name}"] = value.value if isinstance(value, Enum) else value
    return entries


def optimization_fingerprint(trainer: pl.Trainer) -> dict[str, Any]:
    """Each optimizer's class and parameter-group settings and each LR scheduler's class and settings: known
    once ``configure_optimizers`` has run, and read before the checkpoint's optimizer state is restored, which
    would overwrite them."""
    entries: dict[str, Any] = {}
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
    return entries


def is_optimization_entry(name: str) -> bool:
    """Whether fingerprint entry ``name`` is one of :func:`optimization_fingerprint`'s."""
    return name.startswith(("optimizer.", "lr_scheduler."))


def partition_hash(data: FederatedDataSource) -> str:
    """A hash of every client's training-sample indices (``"indices:..."``) when the data provides
    them (``client_indices(cid)``, as :class:`~fl_lightning.data.FederatedDataModule` does), else of
    the clients' sample counts (``"sizes:..."``)."""
    digest = hashlib.sha256()
    client_indices = getattr(data, "client_indices", None)
    if callable(client_indices):
        for cid in range(data.num_clients):
            indices = np.ascontiguousarray(client_indices(cid), dtype=np.int64)
            digest.update(np.int64(len(indices)).tobytes())
            digest.update(indices.tobytes())
        return f"indices:{digest.hexdigest()[:16]}"
    sizes = [data.client_num_samples(cid) for cid in range(data.num_clients)]
    digest.update(np.ascontiguousarray(sizes, dtype=np.int64).tobytes())
    return f"sizes:{digest.hexdigest()[:16]}"


def fingerprint_differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """One ``"name: saved → now"`` line per entry that differs (an entry only one side has shows as absent)."""
    names = [*now, *(name for name in saved if name not in now)]
    return [
        f"{name}: {saved.get(name, _ABSENT)!r} → {now.get(name, _ABSENT)!r}"
        for name in names
        if saved.get(name, _ABSENT) != now.get(name, _ABSENT)
    ]


def check_resume(
    saved: Mapping[str, Any] | None, now: Mapping[str, Any], *, path: Any, allow_changes: bool, optimization: bool = False
) -> None:
    """Refuses a resume from checkpoint ``path`` whose fingerprint ``saved`` differs from ``now`` in the entries
    of one stage: all but the optimizers' and schedulers' (``optimization=False``, when the checkpoint is read),
    or only theirs (``optimization=True``, once they exist). ``now`` holds that stage's entries.

    Raises:
        ResumeMismatchError: listing every difference, unless ``allow_changes`` (then a warning lists them).
    """
    if saved is None:
        if not optimization:
            rank_zero_warn(
                f"Checkpoint {path} has no federation fingerprint (written by an older fl_lightning): resuming "
                "without checking that its clients, partition and algorithm match this run's."
            )
        return
    version = saved.get(_VERSION_KEY, 1)
    saved = {name: value for name, value in saved.items() if is_optimization_entry(name) == optimization}
    if version < _VERSION:
        if not optimization:
            rank_zero_warn(
                f"Checkpoint {path} was written by an older fl_lightning: resuming without checking that its "
                f"{_UNCHECKED[version]} match this run's."
            )
        now = {name: value for name, value in now.items() if name in saved and name != _VERSION_KEY}
        saved = {name: value for name, value in saved.items() if name != _VERSION_KEY}
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
