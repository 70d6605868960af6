"""What the federated loop does for an algorithm, so that no algorithm reaches into the trainer.

An algorithm reaches these through :attr:`Federation.services <fl_lightning.Federation.services>`;
the loops install :class:`~fl_lightning.loops.loop_services.LoopServices`. Outside a fit (an algorithm
set up by hand, in a unit test) the services that need a trainer raise a ``RuntimeError``
naming themselves; the round-metrics channel works everywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from fl_lightning.algorithms.shared.client_update import ClientUpdate

#: One optimizer's per-parameter state, copied to the CPU (``optimizer.state_dict()["state"]``).
OptimizerState = dict[int, dict[str, Any]]


class ServerServices:
    """The services an algorithm may ask of the loop running it (none when run by hand).

    Subclassed by :class:`~fl_lightning.loops.loop_services.LoopServices`, which binds them to a trainer.
    """

    def __init__(self) -> None:
        self._round_metrics: dict[str, float] = {}

    def _needs_loop(self, service: str) -> RuntimeError:
        return RuntimeError(
            f"`Federation.services.{service}` needs the federated loop: run the algorithm through FederatedTrainer.fit."
        )

    def optimizer_states(self) -> list[OptimizerState]:
        """The state of each of the module's optimizers (e.g. Adam's moments), copied to the CPU."""
        raise self._needs_loop("optimizer_states")

    def load_optimizer_states(self, states: list[OptimizerState] | None) -> None:
        """Installs states saved by :meth:`optimizer_states` (``None``: fresh optimizers), keeping
        each optimizer's hyper-parameters (learning rate, betas...)."""
        raise self._needs_loop("load_optimizer_states")

    def optimizers(self) -> list[Optimizer]:
        """The module's optimizers, to read their class and hyper-parameters (e.g. SCAFFOLD's local learning rate)."""
        raise self._needs_loop("optimizers")

    def lr_scheduler_intervals(self) -> list[str]:
        """The ``interval`` (``"step"`` or ``"epoch"``) of each of the module's LR schedulers."""
        raise self._needs_loop("lr_scheduler_intervals")

    def restart_lr_schedules(self, round_idx: int) -> int:
        """Restarts every :class:`~fl_lightning.models.schedulers.StaircaseLR` at ``round_idx``; returns how many."""
        raise self._needs_loop("restart_lr_schedules")

    def reload_evaluation_data(self) -> None:
        """Makes the next server validation request ``val_dataloader()`` again (the evaluation set changed)."""
        raise self._needs_loop("reload_evaluation_data")

    @property
    def accumulate_grad_batches(self) -> int:
        """Batches per optimizer step (the trainer's gradient accumulation factor)."""
        raise self._needs_loop("accumulate_grad_batches")

    def run_folder(self) -> str | None:
        """This run's own folder (its logger's, else the trainer's ``default_root_dir``), where a file that must
        outlive a checkpoint is kept; ``None`` outside a fit."""
        return None

    def request_stop(self) -> None:
        """Asks the run to stop after this round (e.g. a privacy budget is spent); outside a fit
        there is nothing to stop."""

    def train_client(self, round_idx: int, client_id: int, *, seed: int) -> ClientUpdate:
        """Runs the loop's client training once more for ``client_id`` (e.g. one more mixture
        component) with the data order of ``seed``; returns that run's update."""
        raise self._needs_loop("train_client")

    def train_client_later(self, round_idx: int, client_id: int, *, seed: int) -> None:
        """As :meth:`train_client`, for a run whose update the caller does not read (Ditto's personal pass, whose
        ``client_update`` keeps its result): at once under the sequential executors; under the batched executor
        with the other such runs of the group, as one group, before the group's clients end (``on_client_end``)."""
        raise self._needs_loop("train_client_later")

    def report_round_metrics(self, metrics: dict[str, float]) -> None:
        """Adds metrics to this round's logged row (``round/<key>``), e.g. from ``select_clients``,
        so an algorithm need not carry them to ``aggregate`` itself."""
        self._round_metrics.update(metrics)

    def pop_round_metrics(self) -> dict[str, float]:
        """The metrics reported since the last call (the loop calls it once per round)."""
        metrics, self._round_metrics = self._round_metrics, {}
        return metrics
