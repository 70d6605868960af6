"""What each argument of Lightning 2.6's ``Trainer.__init__`` means under :class:`~fl_lightning.FederatedTrainer`.

Every argument is honoured as in Lightning, reinterpreted per round (one Lightning epoch is one round), or
refused at construction with one ``ValueError`` that names it and says what to use instead. The table in
``docs/lightning_integration.md`` ("Trainer arguments under federation") says the same in words;
``tests/test_trainer_arguments.py`` checks that both cover ``Trainer.__init__``'s signature and walks them.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal

from lightning.pytorch.accelerators import AcceleratorRegistry

from fl_lightning.utils.checks import check_real

Meaning = Literal["honoured", "per round", "refused"]

#: How ``FederatedTrainer`` treats each ``Trainer.__init__`` argument ("refused": the values that
#: :func:`check_trainer_arguments` names).
MEANINGS: dict[str, Meaning] = {
    "accelerator": "honoured",
    "strategy": "honoured",
    "devices": "honoured",
    "num_nodes": "honoured",
    "precision": "honoured",
    "logger": "honoured",
    "callbacks": "honoured",
    "fast_dev_run": "per round",
    "max_epochs": "per round",
    "min_epochs": "per round",
    "max_steps": "per round",
    "min_steps": "per round",
    "max_time": "per round",
    "limit_train_batches": "per round",
    "limit_val_batches": "honoured",
    "limit_test_batches": "honoured",
    "limit_predict_batches": "honoured",
    "overfit_batches": "per round",
    "val_check_interval": "refused",
    "check_val_every_n_epoch": "per round",
    "num_sanity_val_steps": "honoured",
    "log_every_n_steps": "honoured",
    "enable_checkpointing": "honoured",
    "enable_progress_bar": "honoured",
    "enable_model_summary": "honoured",
    "accumulate_grad_batches": "honoured",
    "gradient_clip_val": "honoured",
    "gradient_clip_algorithm": "honoured",
    "deterministic": "honoured",
    "benchmark": "honoured",
    "inference_mode": "honoured",
    "use_distributed_sampler": "refused",
    "profiler": "honoured",
    "detect_anomaly": "honoured",
    "barebones": "refused",
    "plugins": "honoured",
    "sync_batchnorm": "refused",
    "reload_dataloaders_every_n_epochs": "refused",
    "default_root_dir": "honoured",
    "enable_autolog_hparams": "honoured",
    "model_registry": "honoured",
}


def check_known_arguments(kwargs: Mapping[str, Any], federation_arguments: Sequence[str]) -> None:
    """Raises one ``TypeError`` for the first argument in ``kwargs`` that is neither a Lightning ``Trainer`` argument
    (:data:`MEANINGS`) nor one of ``federation_arguments``, naming it and the closest accepted name."""
    accepted = [*federation_arguments, *MEANINGS]
    for name in kwargs:
        if name not in MEANINGS:
            close = difflib.get_close_matches(name, accepted, n=1)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            raise TypeError(
                f"FederatedTrainer got an unknown argument `{name}`{hint}: it takes the federation arguments "
                f"({', '.join(federation_arguments)}) and Lightning Trainer's (docs/lightning_integration.md)."
            )


def check_trainer_arguments(kwargs: Mapping[str, Any]) -> None:
    """Raises one ``ValueError`` for the first Lightning ``Trainer`` argument in ``kwargs`` that federation
    refuses or that is out of range (checked here so the message says what is allowed; Lightning's own
    ``MisconfigurationException`` often does not)."""
    _check_count(kwargs, "max_epochs", minimum=0, unlimited=True, what="rounds")
    _check_count(kwargs, "min_epochs", minimum=0, what="rounds before EarlyStopping or should_stop may end the fit")
    _check_count(kwargs, "max_steps", minimum=0, unlimited=True, what="optimizer steps over all clients")
    _check_count(kwargs, "min_steps", minimum=0, what="optimizer steps over all clients")
    _check_count(kwargs, "check_val_every_n_epoch", minimum=1, what="rounds between two validations", none_ok=False)
    _check_count(kwargs, "accumulate_grad_batches", minimum=1, what="batches per optimizer step", none_ok=False)
    _check_count(kwargs, "log_every_n_steps", minimum=1, what="optimizer steps between two logged steps")
    _check_order(kwargs, "min_epochs", "max_epochs")
    _check_order(kwargs, "min_steps", "max_steps")
    if kwargs.get("gradient_clip_val") is not None:
        check_real("gradient_clip_val", kwargs["gradient_clip_val"], low=0)  # 0 means no clipping, as in Lightning
    _check_max_time(kwargs.get("max_time"))
    _check_devices(kwargs.get("devices", "auto"))
    _check_accelerator(kwargs.get("accelerator", "auto"))
    interval = kwargs.get("val_check_interval")
    if interval is not None and not (isinstance(interval, float) and interval == 1.0):  # the int 1 is every batch
        raise ValueError(
            f"`val_check_interval={interval!r}` would validate inside a round, where the module holds one client's "
            "weights; FederatedTrainer validates the global model at the end of each round: use "
            "`check_val_every_n_epoch=N` to validate every N rounds."
        )
    if kwargs.get("limit_train_batches") == 0:
        raise ValueError(
            "`limit_train_batches=0` trains no client: use trainer.validate(...) to evaluate only, or a positive limit "
            "(batches per client per round)."
        )
    if kwargs.get("reload_dataloaders_every_n_epochs", 0):
        raise ValueError(
            f"`reload_dataloaders_every_n_epochs={kwargs['reload_dataloaders_every_n_epochs']!r}` cannot be honoured: "
            "the clients' batches are drawn afresh every round from the federated datamodule, seeded by (seed, round, "
            "client), and the server's validation set is fixed; remove it."
        )
    if kwargs.get("sync_batchnorm", False):
        raise ValueError(
            "`sync_batchnorm=True` would synchronise BatchNorm statistics across processes on every step, but each "
            "process trains different clients (with different step counts); BatchNorm buffers are aggregated at the "
            "end of each round instead: remove it."
        )
    if kwargs.get("barebones", False):
        raise ValueError(
            "`barebones=True` disables the logging and callbacks that report and checkpoint rounds: use "
            "`logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False`."
        )


def batches_per_round(num_batches: int, limit: int | float | None) -> int:
    """How many of a client's ``num_batches`` batches of a round it trains under ``limit_train_batches``
    (which ``overfit_batches`` and ``fast_dev_run`` set): at most ``limit`` batches (an int), or that
    fraction of them (a float), at least one. One Lightning epoch is one round, so Lightning's per-epoch
    limit is a limit per client per round, local epochs included."""
    if limit is None or (isinstance(limit, float) and limit >= 1.0):
        return num_batches
    if isinstance(limit, float):
        return min(num_batches, max(1, int(num_batches * limit)))
    return min(num_batches, limit)


def _check_count(
    kwargs: Mapping[str, Any], name: str, *, minimum: int, what: str, unlimited: bool = False, none_ok: bool = True
) -> None:
    if name not in kwargs or (kwargs[name] is None and none_ok):
        return
    value = kwargs[name]
    if isinstance(value, int) and not isinstance(value, bool) and (value >= minimum or (unlimited and value == -1)):
        return
    allowed = f"an integer >= {minimum}" + (" or -1 (no limit)" if unlimited else "")
    raise ValueError(f"`{name}` ({what}) must be {allowed}, got {value!r}.")


def _check_order(kwargs: Mapping[str, Any], low: str, high: str) -> None:
    """Refuses a minimum above its (limited) maximum, which Lightning would silently let win."""
    minimum, maximum = kwargs.get(low), kwargs.get(high)
    if minimum is not None and maximum is not None and maximum != -1 and minimum > maximum:
        raise ValueError(f"`{low}={minimum}` must not exceed `{high}={maximum}`.")


def _check_max_time(max_time: Any) -> None:
    """Refuses a ``max_time`` (``"DD:HH:MM:SS"``, a ``timedelta`` or a dict of its fields) that is not positive."""
    if max_time is None:
        return
    try:
        if isinstance(max_time, str):
            parts = max_time.strip().split(":")  # as Lightning's Timer reads it: four non-negative integers
            days, hours, minutes, seconds = (int(part) if part.isdigit() else -1 for part in parts)
            duration = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
            duration = duration if min(days, hours, minutes, seconds) >= 0 else None
        else:
            duration = max_time if isinstance(max_time, timedelta) else timedelta(**max_time)
    except (TypeError, ValueError, OverflowError):
        duration = None
    if duration is None or not duration.total_seconds() > 0:
        raise ValueError(
            f"`max_time` must be a positive duration: 'DD:HH:MM:SS', a timedelta or a dict such as "
            f"{{'hours': 1}}, got {max_time!r}."
        )


def _check_devices(devices: Any) -> None:
    if isinstance(devices, str):
        text = devices.strip()
        if text == "auto" or text.lstrip("-").isdigit():
            devices = "auto" if text == "auto" else int(text)
        else:  # "0,1": Lightning parses a list of indices
            return
    if isinstance(devices, list) and devices and all(isinstance(d, int) and d >= 0 for d in devices):
        return
    if devices == "auto" or (isinstance(devices, int) and not isinstance(devices, bool) and (devices > 0 or devices == -1)):
        return
    raise ValueError(
        f"`devices` must be 'auto', a positive number of devices, -1 (all of them) or a non-empty list of device "
        f"indices, got {devices!r}."
    )


def _check_accelerator(accelerator: Any) -> None:
    if not isinstance(accelerator, str) or accelerator == "auto":
        return
    available = available_accelerators()
    if accelerator not in AcceleratorRegistry.available_accelerators() and accelerator != "gpu":
        raise ValueError(f"`accelerator={accelerator!r}` is not an accelerator Lightning knows: use one of {available}.")
    name = "cuda" if accelerator == "gpu" else accelerator
    usable = name in available or (accelerator == "gpu" and "mps" in available)
    if not usable:
        raise ValueError(f"`accelerator={accelerator!r}` is not available on this machine: use one of {available}.")


def available_accelerators() -> list[str]:
    """``"auto"`` and the registered accelerators this machine can run."""
    names = sorted(AcceleratorRegistry.available_accelerators())
    return ["auto", *(name for name in names if AcceleratorRegistry[name]["accelerator"].is_available())]
