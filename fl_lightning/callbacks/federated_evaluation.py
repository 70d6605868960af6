"""Federated evaluation: every ``k`` rounds, the distribution over clients of the global (and
each client's own) model's loss and accuracy on the clients' held-out data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning.pytorch.utilities.seed import isolate_rng
from typing_extensions import override

from fl_lightning import _lightning_compat as compat
from fl_lightning.algorithms.shared.algorithm import Algorithm
from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.evaluation.clients import evaluate_clients
from fl_lightning.evaluation.results import ClientEvaluation
from fl_lightning.evaluation.protocols import SupportsClientGroups, SupportsHoldout, SupportsPersonalizedState
from fl_lightning.evaluation.summary import grouped_summary
from fl_lightning.evaluation.table import ClientTable, table_rows
from fl_lightning.loops.round_log import log_round
from fl_lightning.utils.seeding import make_generator

#: Metric-name prefix of every logged statistic.
PREFIX = "clients"


class FederatedEvaluation(FederatedCallback):
    """Evaluates the global model (and, for personalised algorithms, each client's own model) on
    every client's local held-out data every ``every_n_rounds`` rounds, and logs the distribution.

    After the ``k``-th, ``2k``-th, ... aggregation (rounds, or model versions under FedBuff and
    FedStaleWeight), with the new global model loaded, it logs a row with the round (``round``):
    ``clients/{acc_weighted_mean, acc_mean, acc_std, acc_min, acc_p10, acc_p50, acc_p90,
    acc_worst10, loss_weighted_mean, loss_mean, loss_max, loss_worst10, count}``; the same under
    ``clients/personal/`` for the clients' own models (algorithms with ``personalized_state``:
    FedSoft, IFCA, Ditto; or the global model with each client's local tensors, ``federated_parameters``:
    FedBN, FedPer); and both per group under ``clients/<group>/``. Groups are ``groups``, or those
    the algorithm and the data module offer through ``client_groups()`` (FedALIGN:
    ``priority``/``nonpriority``; FedBuff/FedStaleWeight with named ``DelayGroups``). A per-client
    table goes to loggers that take tables (W&B), else to a CSV file (:class:`ClientTable`).
    Formulas: :mod:`fl_lightning.evaluation.summary`; details: ``docs/federated_evaluation.md``.

    The evaluation is a no-grad, eval-mode probe (:mod:`fl_lightning.evaluation.probe`) that leaves the
    module's weights, training modes, BatchNorm statistics and the global RNG states as they
    were, so training is bit-identical with and without it. With several processes every rank
    evaluates the same clients, without collectives (like the trainer's validation): the
    metrics are identical on every rank and only rank 0 writes the table.

    Args:
        every_n_rounds: evaluate after every ``k``-th round, ``k >= 1``.
        sample_size: evaluate this many clients, drawn uniformly without replacement from
            ``(seed, "federated-evaluation", round)``; ``None``: every client.
        seed: the sample's root seed (default: the trainer's ``seed``).
        groups: named groups of client ids; replaces the groups offered by algorithm and data.
        personalized: also evaluate the clients' own models when the algorithm has them.
        log_table: send the per-client table.

    Example::

        trainer = FederatedTrainer(algorithm=IFCA(num_clusters=2), callbacks=[FederatedEvaluation(every_n_rounds=5)])
        trainer.fit(model, datamodule=FederatedDataModule(train, test, num_clients=20, holdout_fraction=0.2))
    """

    def __init__(
        self,
        every_n_rounds: int = 1,
        *,
        sample_size: int | None = None,
        seed: int | None = None,
        groups: Mapping[str, Sequence[int]] | None = None,
        personalized: bool = True,
        log_table: bool = True,
    ) -> None:
        if isinstance(every_n_rounds, bool) or not isinstance(every_n_rounds, int) or every_n_rounds < 1:
            raise ValueError(f"`every_n_rounds` must be an int >= 1 (evaluate every k-th round), got {every_n_rounds!r}.")
        if sample_size is not None and (isinstance(sample_size, bool) or not isinstance(sample_size, int) or sample_size < 1):
            raise ValueError(f"`sample_size` must be None (every client) or an int >= 1, got {sample_size!r}.")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"`seed` must be None (the trainer's seed) or an int >= 0, got {seed!r}.")
        self.every_n_rounds = every_n_rounds
        self.sample_size = sample_size
        self.seed = seed
        self.groups = None if groups is None else _checked_groups(groups, "groups")
        self.personalized = personalized
        self.log_table = log_table
        #: The table writer (its ``path`` is the CSV file, when one is written).
        self.table = ClientTable()
        #: Per-client results of the latest evaluation.
        self.last_results: list[ClientEvaluation] = []
        self._data: SupportsHoldout | None = None
        self._algorithm: Algorithm | None = None
        self._trainer_loop: object = None
        self._resolved_groups: dict[str, list[int]] = {}
        self._root_seed = 0

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        algorithm = getattr(trainer.fit_loop, "algorithm", None)
        if not isinstance(algorithm, Algorithm):
            raise TypeError("FederatedEvaluation runs inside a federated fit: use it with FederatedTrainer.")
        data = trainer.datamodule
        if not isinstance(data, SupportsHoldout):
            raise TypeError(
                f"FederatedEvaluation needs each client's held-out data: {type(data).__name__} has no "
                "`holdout_dataloader(cid)`; use FederatedDataModule(..., holdout_fraction=0.2)."
            )
        if getattr(data, "holdout_fraction", None) == 0:
            raise ValueError(
                "FederatedEvaluation evaluates on each client's held-out data, but the data module has "
                "holdout_fraction=0: set `holdout_fraction` (e.g. FederatedDataModule(..., holdout_fraction=0.2))."
            )
        num_clients = algorithm.federation.num_clients
        if self.sample_size is not None and self.sample_size > num_clients:
            raise ValueError(f"`sample_size={self.sample_size}` is outside 1..{num_clients}, the number of clients.")
        self._data, self._algorithm, self._trainer_loop = data, algorithm, trainer.fit_loop
        self._root_seed = algorithm.federation.seed if self.seed is None else self.seed
        self._resolved_groups = self._collect_groups(algorithm, data, num_clients)
        self.table.reset()

    def is_due(self, round_idx: int) -> bool:
        """Whether the evaluation runs after round ``round_idx`` (0-based): every ``k``-th round."""
        return (round_idx + 1) % self.every_n_rounds == 0

    def clients_for(self, round_idx: int) -> list[int]:
        """The clients evaluated after ``round_idx``: all, or a seeded sample (sorted)."""
        if self._algorithm is None:
            raise RuntimeError("FederatedEvaluation.clients_for needs the federation: call it once the fit has started.")
        num_clients = self._algorithm.federation.num_clients
        if self.sample_size is None:
            return list(range(num_clients))
        order = torch.randperm(num_clients, generator=make_generator(self._root_seed, "federated-evaluation", round_idx))
        return sorted(order[: self.sample_size].tolist())

    @property
    def resolved_groups(self) -> dict[str, list[int]]:
        """The groups summarised in this fit: ``groups``, or those offered (resolved when the fit starts)."""
        return dict(self._resolved_groups)

    @override
    def on_round_aggregated(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, round_idx: int, metrics: dict[str, float]
    ) -> None:
        if not self.is_due(round_idx):
            return
        assert self._data is not None
        personal = self._personal_source()
        # DataLoader iterators draw their base seed from the global generator: keep it untouched.
        with isolate_rng(include_cuda=pl_module.device.type == "cuda"):
            results = evaluate_clients(
                pl_module, self._data, self.clients_for(round_idx), personal.personalized_state if personal else None
            )
        self.last_results = results
        if not results:
            rank_zero_warn(f"Round {round_idx}: no evaluated client has held-out samples; nothing to log.")
            return
        log_round(trainer, round_idx, grouped_summary(results, self._resolved_groups, prefix=PREFIX))
        if self.log_table and trainer.is_global_zero:
            columns, rows = table_rows(round_idx, results, self._resolved_groups, personal=personal is not None)
            self.table.send(trainer, columns, rows, step=compat.epoch_end_log_step(trainer))

    def _personal_source(self) -> SupportsPersonalizedState | None:
        """The algorithm's clients' own models, else each client's local tensors (``federated_parameters``)."""
        if not self.personalized:
            return None
        if isinstance(self._algorithm, SupportsPersonalizedState):
            return self._algorithm
        client_tensors = getattr(self._trainer_loop, "client_tensors", None)
        return client_tensors if client_tensors is not None and client_tensors.local else None

    def _collect_groups(self, algorithm: Algorithm, data: object, num_clients: int) -> dict[str, list[int]]:
        """The explicit groups, else the union of those the algorithm and the data offer."""
        sources: dict[str, dict[str, list[int]]] = {}
        if self.groups is not None:
            sources["groups"] = self.groups
        else:
            for owner in (algorithm, data):
                if isinstance(owner, SupportsClientGroups):
                    source = f"{type(owner).__name__}.client_groups()"
                    sources[source] = _checked_groups(owner.client_groups(), source)
        merged: dict[str, list[int]] = {}
        for source, groups in sources.items():
            for name, members in groups.items():
                bad = [c for c in members if not 0 <= c < num_clients]
                if bad:
                    raise ValueError(f"{source}: group {name!r} has client ids {bad} outside 0..{num_clients - 1}.")
                if name in merged and merged[name] != members:
                    raise ValueError(f"Two sources define client group {name!r} differently; pass `groups=` explicitly.")
                merged[name] = members
        return merged


def _checked_groups(groups: Mapping[str, Sequence[int]], source: str) -> dict[str, list[int]]:
    """``{name: sorted distinct ids}``; a name must be a non-empty string without ``/``, other than ``personal``."""
    if not isinstance(groups, Mapping):
        raise TypeError(f"{source} must map group names to client ids, got {type(groups).__name__}.")
    checked = {}
    for name, members in groups.items():
        if not isinstance(name, str) or not name or "/" in name or name == "personal":
            raise ValueError(f"{source}: group name {name!r} must be a non-empty string without '/', other than 'personal'.")
        if isinstance(members, (str, bytes)) or any(isinstance(c, bool) or not isinstance(c, int) for c in members):
            raise TypeError(f"{source}: group {name!r} must list int client ids, got {members!r}.")
        checked[name] = sorted(set(members))
    return checked
