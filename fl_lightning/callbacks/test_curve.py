"""The opt-in per-round test curve: the test loop on the global model every few rounds of ``fit``."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.utilities.model_helpers import is_overridden
from typing_extensions import override

from fl_lightning import _lightning_compat as compat
from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.loops.round_log import log_round


class TestCurve(FederatedCallback):
    """Runs the test loop (the module's ``test_step`` on ``test_dataloader``) after every
    ``every_n_rounds``-th round of ``fit`` and after the last one, for the test-accuracy curves papers plot.

    What ``test_step`` logs goes to the loggers under its own names (e.g. ``test_acc``), in a row
    with the round (``round``), and into ``trainer.callback_metrics``. It is a report, never a criterion:
    monitor validation metrics for model selection and early stopping (``docs/evaluation.md``).
    Without this callback, ``fit`` never reads the test set.

    Args:
        every_n_rounds: test after rounds ``n - 1, 2n - 1, ...`` (0-based), an int >= 1.

    Example::

        trainer = FederatedTrainer(max_epochs=100, callbacks=[TestCurve(every_n_rounds=5)])
    """

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, every_n_rounds: int = 1) -> None:
        if isinstance(every_n_rounds, bool) or not isinstance(every_n_rounds, int) or every_n_rounds < 1:
            raise ValueError(f"TestCurve: every_n_rounds must be an int >= 1, got {every_n_rounds!r}.")
        self.every_n_rounds = every_n_rounds

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and not is_overridden("test_step", pl_module):
            raise ValueError(f"TestCurve runs test_step every round, but {type(pl_module).__name__} has no test_step.")

    @override
    def on_round_aggregated(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, metrics: dict[str, float]
    ) -> None:
        last = trainer.max_epochs is not None and round_idx + 1 >= trainer.max_epochs
        if (round_idx + 1) % self.every_n_rounds == 0 or last:
            log_round(trainer, round_idx, compat.run_test_during_fit(trainer))
