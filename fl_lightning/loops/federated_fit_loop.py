"""Synchronous federated rounds inside one Lightning ``fit``."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sized
from dataclasses import replace
from typing import Any

import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

import lightning.pytorch as pl
from fl_lightning import _lightning_compat as compat
from fl_lightning.algorithms.shared.algorithm import TRAINING_METRICS, Algorithm, ClientContext, ClientUpdate, check_fresh_optimizer
from fl_lightning.algorithms.shared.folding import RoundFold
from fl_lightning.algorithms.shared.summable import SupportsWeightedSum, apply_sum, can_shard
from fl_lightning.callbacks.client_loss import ClientLossRecorder
from fl_lightning.callbacks.federated_callback import call_federated_hook
from fl_lightning.checkpointing import frozen_base, run_directory, sweep_temp_files
from fl_lightning.checkpointing.checkpoint_io import CheckpointError, validate_federated_state, validate_restored_state
from fl_lightning.distributed.sharding import ClientSharding
from fl_lightning.distributed.strategy import FederatedDDPStrategy
from fl_lightning.server.federation import FederatedDataSource, Federation, require_federated_data
from fl_lightning.checkpointing.fingerprint import (
    check_resume,
    federation_fingerprint,
    optimization_fingerprint,
    settings_fingerprint,
)
from fl_lightning.loops.client_executor import ClientExecutor, ClientRuntime
from fl_lightning.loops.executor_choice import make_executor
from fl_lightning.loops.hparams_session import log_federated_hparams
from fl_lightning.loops.guards import aggregate_or_roll_back, apply_bound, bound_updates, decode_and_screen
from fl_lightning.loops.round_log import log_round, without_client_statistics
from fl_lightning.loops.streamed_round import stream_round
from fl_lightning.loops.frozen_heap import frozen_heap
from fl_lightning.loops.records import kept_records
from fl_lightning.loops.loop_services import LoopServices
from fl_lightning.loops.stop_reason import failure_reason, stop_reason
from fl_lightning.mixins.regularized import TASK_LOSS
from fl_lightning.server.client_tensors import ClientTensors
from fl_lightning.server.federated_parameters import FederatedParameters, ParameterKinds, shared_tensors
from fl_lightning.server.model_state import State, live_tensors, load_into, snapshot
from fl_lightning.server.spill_folder import sweep_orphan_spill_folders
from fl_lightning.models.schedulers import RoundStepSchedules
from fl_lightning.secure.secure_aggregation import SecureAggregation
from fl_lightning.trainer_arguments import batches_per_round
from fl_lightning.robust.update_bounds import UpdateBound, update_norm
from fl_lightning.utils.init_args import RecordsInitArgs, flat_hparams
from fl_lightning.utils.saved_state import InvalidStateError
from fl_lightning.utils.seeding import derive_seed


def resolve_clients_per_round(value: int | float, num_clients: int) -> int:
    """A count in ``1..num_clients`` from a count (int) or a fraction of the clients (float in (0, 1])."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`clients_per_round` must be an int or a float, got {value!r}.")
    if isinstance(value, float):
        if not 0.0 < value <= 1.0:
            raise ValueError(f"`clients_per_round` as a fraction must be in (0, 1], got {value}.")
        return max(1, round(value * num_clients))
    if not 1 <= value <= num_clients:
        raise ValueError(
            f"`clients_per_round={value}` is not allowed with num_clients={num_clients}: "
            f"use a count in 1..{num_clients} or a fraction in (0, 1]."
        )
    return value


def client_means(updates: list[ClientUpdate], keys: tuple[str, ...]) -> dict[str, float]:
    """``round/<key>``: the mean of each client metric in ``keys`` over the updates that report it."""
    means = {}
    for key in keys:
        values = [u.metrics[key] for u in updates if key in u.metrics]
        if values:
            means[f"round/{key}"] = sum(values) / len(values)
    return means


def round_batches(data: FederatedDataSource, client: ClientContext, trainer: pl.Trainer) -> Sized:
    """``client``'s batch stream for its round from ``data``, cut to the trainer's ``limit_train_batches``."""
    accumulate = trainer.accumulate_grad_batches

    def stream(num_epochs: int | None, num_batches: int | None) -> Sized:
        batches = data.client_batches(
            client.client_id, num_epochs=num_epochs, num_batches=num_batches, generator=torch.Generator().manual_seed(client.seed)
        )
        return batches if hasattr(batches, "__len__") else list(batches)  # Sized, without an ABC check per client

    batches = stream(client.num_epochs, None if client.num_steps is None else client.num_steps * accumulate)
    count = len(batches)
    limit = batches_per_round(count, trainer.limit_train_batches)
    # The same generator seed, so the cut stream is the first `limit` batches of the uncut one.
    return stream(None, limit) if limit < count else batches


class FederatedFitLoop(compat.FitLoopBase):
    """One Lightning epoch is one federated round; one ``fit`` runs them all.

    Example::

        for round in range(max_epochs):                          # on_train_epoch_start
            clients = algorithm.select_clients(round)
            for client in clients:
                module <- global weights (in place)               # param.copy_
                reset optimizer state; step LR schedulers <- the round's start
                algorithm.configure_client(client, module, global)
                ClientEpochLoop over the client's batches         # training_step, hooks, callbacks
                update = algorithm.client_update(client, module, local - global)
            algorithm.aggregate(round, global, finite updates)   # >= float32 master copy; or, for an algorithm
                                                                  # with a fold, each update folded in as it comes
            module <- global weights; epoch LR schedulers step; step LR schedulers move on one round
            algorithm.evaluate(round, module); validation loop    # server evaluation
            log the round's row (round metrics + validation)       # on_train_epoch_end, checkpoints

    A round is atomic for checkpointing: resuming continues at the first round whose
    aggregation is not in the saved weights, and gives the same weights as an uninterrupted run.

    Args:
        trainer: the trainer this loop belongs to.
        algorithm: the federated algorithm.
        clients_per_round: a count, or a float fraction of the clients.
        local_epochs: local epochs per client (exclusive with ``local_steps``).
        local_steps: local optimizer steps per client.
        seed: root seed of client selection and of every client's data order.
        reset_optimizer: clear the optimizer state (momentum, Adam moments) before each client.
        client_executor: which :class:`~fl_lightning.loops.client_executor.ClientExecutor` trains the
            clients: ``"auto"`` (lean whenever it gives Lightning's weights:
            :mod:`~fl_lightning.loops.executor_choice`), ``"lightning"`` (Lightning's epoch loop),
            ``"lean"`` (:mod:`~fl_lightning.loops.lean_executor`) or ``"batched"``
            (:mod:`~fl_lightning.loops.batched_executor`).
        max_batched_clients: the batched executor's cap on clients trained at once (``None``: no cap).
        compile_backend: the ``torch.compile`` backend of the batched executor's steps (``None``: eager).
        update_bound: clips or filters the clients' update norms before aggregation (``None``: no bound).
        federated_parameters: which tensors are shared, frozen or local (with the algorithm's own selection merged in;
            :mod:`~fl_lightning.server.federated_parameters`).
        allow_resume_changes: resume from a checkpoint whose federation fingerprint differs (with a warning).
        client_state_memory: bytes of per-client state the algorithm's stores keep in memory together, each an
            equal share, beyond which they spill to the run folder (``None``: no limit).
        min_steps, max_steps: Lightning's step limits, for the loop's own client epoch loop.

    The loop installs its epoch loop (:class:`~fl_lightning._lightning_compat.ClientEpochLoop`)
    and its :attr:`loss_recorder` callback on ``trainer``.
    """

    def __init__(
        self,
        trainer: pl.Trainer,
        *,
        min_epochs: int | None,
        max_epochs: int | None,
        algorithm: Algorithm,
        clients_per_round: int | float,
        local_epochs: int | None,
        local_steps: int | None,
        seed: int,
        reset_optimizer: bool,
        client_executor: str = "auto",
        max_batched_clients: int | None = None,
        compile_backend: str | None = None,
        update_bound: UpdateBound | None = None,
        federated_parameters: FederatedParameters | None = None,
        allow_resume_changes: bool = False,
        client_state_memory: int | None = None,
        min_steps: int | None = None,
        max_steps: int = -1,
    ) -> None:
        super().__init__(trainer, min_epochs=min_epochs, max_epochs=max_epochs)
        # The recorder reads the task loss there: Lightning's "loss" is divided by accumulate_grad_batches.
        self.epoch_loop = compat.ClientEpochLoop(trainer, min_steps=min_steps, max_steps=max_steps, returned_loss_key=TASK_LOSS)
        #: Each client's mean training losses: the Lightning executor's steps reach it as a callback.
        self.loss_recorder = ClientLossRecorder()
        trainer.callbacks.append(self.loss_recorder)  # type: ignore[attr-defined]
        self.algorithm = algorithm
        self.clients_per_round = clients_per_round
        self.local_epochs = local_epochs
        self.local_steps = local_steps
        self.seed = seed
        self.reset_optimizer = reset_optimizer
        self.client_executor = client_executor
        self._executor: ClientExecutor | None = None
        self.max_batched_clients = max_batched_clients
        self.compile_backend = compile_backend
        self.update_bound = update_bound
        self.federated_parameters = federated_parameters or FederatedParameters()
        #: The module's tensors by kind, resolved at set-up (``None`` before).
        self.kinds: ParameterKinds | None = None
        #: Each client's local tensors and the frozen buffers (set up with the federation).
        self.client_tensors: ClientTensors | None = None
        #: The frozen parameters' version counters when the frozen tensors were last hashed, and the reference.
        self._frozen: tuple[list[int], frozen_base.FrozenReference] | None = None
        self.allow_resume_changes = allow_resume_changes
        self.client_state_memory = client_state_memory
        self.global_state: State = {}
        #: Client ids selected in each round so far, from round ``history_start`` on (a resumed run has the
        #: checkpoint's newest ones, :mod:`~fl_lightning.loops.records`).
        self.history: list[list[int]] = []
        self.history_start = 0
        self.total_upload_bytes = 0
        self.total_download_bytes = 0
        self._live: State = {}
        self._rounds_done = 0
        self._in_round = False
        #: The step counters when the current round began: a mid-round resume replays the round from there.
        self._round_start_steps = (0, 0)
        self._loaded: dict[str, Any] | None = None
        self._sharding: ClientSharding | None = None
        self._fingerprint: dict[str, Any] = {}
        self._schedules: RoundStepSchedules | None = None
        #: How the last fit ended (:mod:`~fl_lightning.loops.stop_reason`); ``None`` before one has.
        self.stop_reason: str | None = None
        #: The checkpoint a resume read and this run's fingerprint but for the optimizers' and schedulers', then computed.
        self._settings: tuple[Any, dict[str, Any]] | None = None
        #: This run's optimizer and scheduler settings, read before a resume restores the optimizer.
        self._optimization: dict[str, Any] | None = None

    @property
    def federation(self) -> Federation:
        return self.algorithm.federation

    @property
    def executor(self) -> str | None:
        """The executor clients run with: ``client_executor``, or for ``"auto"`` the one chosen
        (``None`` until the first client has trained)."""
        if self._executor is None:
            return None if self.client_executor == "auto" else self.client_executor
        return self._executor.chosen

    @property
    def in_round(self) -> bool:
        """Whether a round is under way: the module then holds a client's weights, not the global model."""
        return self._in_round

    def global_module_state(self) -> State:
        """The global model as the module's ``state_dict``: its keys and dtypes, detached copies (the shared tensors
        from the master copy, under each of their names; the initial local tensors and frozen buffers; the frozen
        parameters as the module holds them)."""
        assert self.kinds is not None and self.client_tensors is not None, "the federation is set up"
        values = {**self.client_tensors.initial, **self.global_state}
        return {
            name: values.get(self.kinds.canonical(name), t).to(t.dtype, copy=True)
            for name, t in live_tensors(self.trainer.lightning_module).items()
        }

    @override
    def run(self) -> None:
        """Lightning's ``run``. However the fit ends (a limit, ``EarlyStopping``, ``KeyboardInterrupt``, an
        exception inside a client), the module then holds the global model of the last completed round, never
        a client's weights; :attr:`stop_reason` and the fit's last log line say how it ended."""
        self.stop_reason, rounds_before = None, self._rounds_done
        if self._loaded is not None and self.skip:
            # Resumed with no round left (a finished run): the checkpoint must still be this run's.
            self._setup_federation()
        try:
            with frozen_heap():
                super().run()
            self.stop_reason = stop_reason(self.trainer, self._rounds_done)
        except BaseException as error:
            self.stop_reason = failure_reason(error, self.epoch_progress.current.processed, self._rounds_done)
            raise
        finally:
            trained = self._in_round or self._rounds_done > rounds_before  # else a set-up error: its own message only
            if self._in_round:
                self._load_global_model()
                self._in_round = False
            if trained:
                rank_zero_info(f"Federated fit ended: {self.stop_reason}.")

    @override
    def setup_data(self) -> None:
        """Nothing to set up: each client's batches are prepared when it trains."""

    @override
    def reset(self) -> None:
        torch.set_grad_enabled(True)
        compat.set_completed_epochs(self.epoch_progress, self._rounds_done)
        compat.clear_restarting(self)

    @override
    def on_run_start(self) -> None:
        self._setup_federation()
        super().on_run_start()

    def _setup_federation(self) -> None:
        trainer, module = self.trainer, self.trainer.lightning_module
        self._sharding = self._client_sharding() if trainer.world_size > 1 else None
        data = require_federated_data(trainer.datamodule)
        self._check_update_bound()
        check_fresh_optimizer(self.algorithm, self.reset_optimizer)
        if trainer.is_global_zero:
            sweep_temp_files(trainer)
            sweep_orphan_spill_folders(_spill_parent(trainer))
        self._frozen = None
        self.kinds = self._resolve_kinds()
        every_tensor = live_tensors(module)
        self._live = shared_tensors(self.kinds, every_tensor)
        self.client_tensors = ClientTensors(self.kinds, every_tensor)
        if self._sharding is not None and self.client_tensors.local:
            raise ValueError(
                f"Local tensors ({', '.join(self.kinds.local[:3])}, ...) are kept per client, and the personalised "
                f"evaluation reads every client's on each process, but under client sharding over {trainer.world_size} "
                "processes each keeps only the clients it trains: run with devices=1."
            )
        # Built after Lightning restored a checkpoint's schedulers: their state is the next round's start.
        self._schedules = RoundStepSchedules(trainer, self.steps_per_round, first_round=self._rounds_done)
        runtime = ClientRuntime(
            trainer,
            self.algorithm,
            self._live,
            self.client_batches,
            self.loss_recorder,
            self.reset_optimizer,
            self._schedules,
            self.client_tensors or None,  # None: nothing to test per client
        )
        self._executor = make_executor(
            self.client_executor, runtime, max_batched_clients=self.max_batched_clients, compile_backend=self.compile_backend
        )
        federation = Federation(
            data=data,
            module=module,
            clients_per_round=resolve_clients_per_round(self.clients_per_round, data.num_clients),
            seed=self.seed,
            param_names=self.kinds.shared_parameters,
            local_epochs=self.local_epochs,
            local_steps=self.local_steps,
            num_rounds=self.max_epochs if self.max_epochs is not None and self.max_epochs >= 0 else None,
            services=LoopServices(self),
            kinds=self.kinds,
            client_tensors=self.client_tensors,
        )
        # Checked before the algorithm's set-up, whose own errors a changed federation could trigger.
        optimization = self._optimization or optimization_fingerprint(trainer)
        read, self._settings = self._settings, None
        settings = read[1] if read is not None and read[0] == trainer.ckpt_path else None  # else from another fit
        self._fingerprint = {**(settings or self._settings_fingerprint()), **optimization}
        self._optimization = None
        if self._loaded is not None:
            saved, path, allow = self._loaded.get("fingerprint"), trainer.ckpt_path, self.allow_resume_changes
            if settings is None:  # read past CheckedCheckpointIO (a strategy's own IO): checked here instead
                check_resume(saved, self._fingerprint, path=path, allow_changes=allow)
            check_resume(saved, optimization, path=path, allow_changes=allow, optimization=True)
        self.algorithm.setup(federation)
        self._bind_client_stores()
        for setting, instead in self.algorithm.overridden_settings().items():
            rank_zero_warn(f"{type(self.algorithm).__name__} overrides the trainer's `{setting}`: {instead}.")
        self.global_state = snapshot(self._live)
        rank_zero_info(f"Federated values: {self.kinds.summary_line(every_tensor)} (docs/federated_parameters.md).")
        # TensorBoard: with the hyper-parameters logged before (the user's, the CLI's config), as one session.
        log_federated_hparams(trainer, self.hparams())
        if self._loaded is not None:
            self._restore(self._loaded)
            self._loaded = None

    def _resolve_kinds(self) -> ParameterKinds:
        """The module's tensors by kind: the trainer's selection merged with the algorithm's."""
        selection = self.federated_parameters
        algorithm_selection = self.algorithm.federated_parameters()
        if algorithm_selection is not None:
            selection = selection.merged(algorithm_selection, origin=type(self.algorithm).__name__)
        return selection.resolve(self.trainer.lightning_module)

    def _settings_fingerprint(self) -> dict[str, Any]:
        """Every fingerprint entry known before the optimizers exist (:mod:`~fl_lightning.checkpointing.fingerprint`)."""
        data = require_federated_data(self.trainer.datamodule)
        federation = federation_fingerprint(
            data,
            self._resolve_kinds(),
            self.algorithm,
            clients_per_round=resolve_clients_per_round(self.clients_per_round, data.num_clients),
            seed=self.seed,
            local_epochs=self.local_epochs,
            local_steps=self.local_steps,
            update_bound=self.update_bound,
            reset_optimizer=self.reset_optimizer,
        )
        return {**federation, **settings_fingerprint(self.trainer)}

    def check_checkpoint(self, checkpoint: Mapping[str, Any], path: Any) -> None:
        """Checks a checkpoint a resume has read, before Lightning restores anything from it: its federated state
        is there and well-formed, and its fingerprint's entries but the optimizers' and schedulers' match this
        run's (those are checked once they exist, in set-up)."""
        federated: Any = checkpoint
        for key in ("loops", "fit_loop", "state_dict", "federated"):
            federated = federated.get(key) if isinstance(federated, Mapping) else None
        validate_federated_state(federated, path=path, max_rounds=self.max_epochs)
        settings = self._settings_fingerprint()
        check_resume(federated.get("fingerprint"), settings, path=path, allow_changes=self.allow_resume_changes)
        self._check_shapes(checkpoint.get("state_dict"), path)
        self._settings = (path, settings)

    def _check_shapes(self, saved: Any, path: Any) -> None:
        """The checkpoint's weights fit the module (a deliberate change, ``allow_resume_changes``, cannot resize it)."""
        module = live_tensors(self.trainer.lightning_module)
        for name, value in (saved or {}).items():
            if name in module and isinstance(value, torch.Tensor) and value.shape != module[name].shape:
                raise CheckpointError(
                    f"Checkpoint {path}: its `{name}` has shape {list(value.shape)}, but the model's has "
                    f"{list(module[name].shape)}: a resume cannot change the model's shapes, even with allow_resume_changes=True."
                )

    def _load_global_model(self) -> None:
        """The module holds the global model: the shared tensors' master copy, the initial local tensors and frozen buffers."""
        load_into(self._live, self.global_state)
        assert self.client_tensors is not None
        self.client_tensors.reset()

    def _bind_client_stores(self) -> None:
        """Gives each of the algorithm's client stores its share of ``client_state_memory``, a spill folder in
        the experiment's folder and, under client sharding, the clients this rank owns."""
        stores = self.algorithm.client_stores()
        assert self.client_tensors is not None
        if self.client_tensors.local:
            stores = {**stores, "local tensors": self.client_tensors.store}
        if stores and self.algorithm.secret_sample:
            raise ValueError(
                f"{type(self.algorithm).__name__} draws each round's clients from a secret (secure_mode=True), but the "
                f"per-client state ({', '.join(stores)}) is saved under the ids of the clients that trained, which would "
                "reveal the sample: share every tensor (no federated_parameters local selection) or use secure_mode=False."
            )
        budget = self.client_state_memory
        sharding = self._sharding
        for store in stores.values():
            store.bind(
                budget=None if budget is None else budget // len(stores),
                folder=_spill_parent(self.trainer),
                owns=sharding.owns if sharding is not None else None,
                gather=sharding.gather_entries if sharding is not None else None,
                reduce=sharding.sum_tensor if sharding is not None else None,
            )

    def _check_update_bound(self) -> None:
        if self.update_bound is not None and not self.algorithm.uploads_deltas:
            raise ValueError(
                f"update_bound={type(self.update_bound).__name__}(...) bounds the norms of client deltas, but "
                f"{type(self.algorithm).__name__}'s uploads are not deltas (uploads_deltas is False): "
                "remove the update bound for this algorithm."
            )
        if self.update_bound is not None:
            self.algorithm.check_update_bound(self.update_bound)

    def _client_sharding(self) -> ClientSharding:
        """Checks that this run can shard its clients over the trainer's processes."""
        trainer = self.trainer
        if not isinstance(trainer.strategy, FederatedDDPStrategy):
            raise ValueError(
                f"With {trainer.world_size} processes, FederatedTrainer needs strategy='ddp' (FederatedDDPStrategy); "
                f"got {type(trainer.strategy).__name__}."
            )
        if not (can_shard(self.algorithm) or self.algorithm.gathers_updates or isinstance(self.algorithm, SecureAggregation)):
            raise ValueError(
                f"{type(self.algorithm).__name__} cannot shard its clients over {trainer.world_size} processes: "
                "only synchronous algorithms whose aggregation is a weighted sum of (decoded) client deltas "
                "(SummableAggregation: FedAvg, FedProx, their server optimizers, FedALIGN over them, CompressedFedAvg, "
                "FedMRN, FedMRNS, FedAvgSM; not FedPM, whose server sets its mask probabilities to the clients' mean "
                "mask), or a robust rule or secure aggregation over one, can; run it with devices=1."
            )
        return ClientSharding(trainer.strategy, by_owner=bool(self.algorithm.client_stores()))

    def hparams(self) -> dict[str, Any]:
        """The whole federated configuration as flat hyper-parameters, so runs group and filter by
        any of it: the algorithm and its nested constructor arguments (``fl/algorithm.mu``,
        ``fl/algorithm.server_optimizer.lr``, ...), the data (``fl/data.partitioner.alpha``, ...,
        for data that records its arguments), clients per round, local work, executor and seed."""
        data = self.trainer.datamodule
        return {
            **flat_hparams("fl/algorithm", self.algorithm),
            **(flat_hparams("fl/data", data) if isinstance(data, RecordsInitArgs) else {}),
            "fl/num_clients": self.federation.num_clients,
            "fl/clients_per_round": self.federation.clients_per_round,
            "fl/rounds": self.max_epochs,
            "fl/local_epochs": self.local_epochs,
            "fl/local_steps": self.local_steps,
            "fl/seed": self.seed,
            "fl/reset_optimizer": self.reset_optimizer,
            "fl/client_executor": self.client_executor,
            "fl/max_batched_clients": self.max_batched_clients,
            "fl/compile_backend": self.compile_backend,
            **flat_hparams("fl/federated_parameters", self.federated_parameters),
            **{f"fl/parameters.{k}": v for k, v in self.kinds.summary(live_tensors(self.trainer.lightning_module)).items()},
        }

    @override
    def on_advance_start(self) -> None:
        self._round_start_steps = compat.step_counters(self.trainer)
        self.epoch_progress.increment_ready()
        compat.call_epoch_start_hooks(self.trainer)
        self.epoch_progress.increment_started()

    @override
    def advance(self) -> None:
        round_idx = self.epoch_progress.current.processed
        started = time.perf_counter()
        clients = self._select(round_idx)
        call_federated_hook(self.trainer, "on_clients_selected", round_idx, clients)
        self._in_round = True
        download_bytes = len(clients) * self.algorithm.download_bytes(self.global_state)
        fold = self._round_fold(round_idx)
        if fold is not None:
            received, metrics = self._stream_round(round_idx, clients, fold)
        elif self._sharding is None:
            received = self.train_clients(round_idx, clients)
            metrics = self.aggregate(round_idx, received)
        else:
            received, metrics = self._aggregate_sharded(round_idx, clients)
        self.end_round(round_idx, started, received, download_bytes, metrics)

    def aggregate(self, round_idx: int, received: list[ClientUpdate]) -> dict[str, float]:
        """Aggregates the usable updates into the global model and loads it into the module.

        Each update is decoded (:meth:`~fl_lightning.Algorithm.decode_update`); a malformed one is
        rejected, a non-finite one dropped, and the update bound may clip or reject the rest
        (:mod:`fl_lightning.loops.guards`). With none left, the global model is unchanged; a
        non-finite aggregate is rolled back. Returns the algorithm's metrics plus the counts.
        """
        screened = decode_and_screen(self.algorithm, round_idx, received)
        updates, refused = self._bound(round_idx, [u.client_id for u in received], screened.finite)
        metrics, rolled_back = {}, False
        if updates or self.algorithm.aggregates_empty_rounds:
            metrics, rolled_back = aggregate_or_roll_back(
                round_idx,
                self.algorithm,
                self.global_state,
                lambda: self.algorithm.aggregate(round_idx, self.global_state, updates),
            )
        return self._finish_aggregation(
            round_idx,
            metrics,
            aggregated=len(updates),
            dropped=len(screened.dropped),
            rejected=len(screened.rejected) + len(refused),
            rolled_back=rolled_back,
        )

    def _round_fold(self, round_idx: int) -> RoundFold | None:
        """The algorithm's fold of this round's updates when the round can stream them
        (:mod:`~fl_lightning.loops.streamed_round`): one process, and no update bound that compares the clients' norms."""
        bound = self.update_bound
        if self._sharding is not None or (bound is not None and bound.needs_all_norms):
            return None
        return self.algorithm.start_fold(round_idx, self.global_state)

    def _stream_round(self, round_idx: int, clients: list[int], fold: RoundFold) -> tuple[list[ClientUpdate], dict[str, float]]:
        """Trains ``clients`` and folds each one's update into ``fold`` as it finishes; the payload-free reports and
        the round's metrics, as :meth:`aggregate` gives them."""
        assert self._executor is not None, "clients train once the fit has set up the federation"
        contexts = [self.client_context(round_idx, cid) for cid in clients]
        streamed = stream_round(
            round_idx,
            self.algorithm,
            self._executor.stream(contexts, self.global_state),
            fold,
            self.global_state,
            lambda updates: self._bound(round_idx, clients, updates),
        )
        counts = {"dropped": streamed.dropped, "rejected": streamed.rejected, "rolled_back": streamed.rolled_back}
        return streamed.received, self._finish_aggregation(round_idx, streamed.metrics, aggregated=streamed.aggregated, **counts)

    def _aggregate_sharded(self, round_idx: int, clients: list[int]) -> tuple[list[ClientUpdate], dict[str, float]]:
        """This rank trains its share of ``clients``; one all-reduce combines every rank's weighted sum
        (or, for an algorithm that :attr:`~fl_lightning.Algorithm.gathers_updates`, every rank first
        gathers all decoded updates and aggregates them itself)."""
        assert self._sharding is not None
        algorithm = self.algorithm
        gathers = algorithm.gathers_updates
        local = self.train_clients(round_idx, self._sharding.share(clients))
        screened = decode_and_screen(algorithm, round_idx, local)
        updates, refused = self._bound(round_idx, clients, screened.finite)
        payloads = self._sharding.gather_payloads(clients, updates, self.global_state) if gathers else {}
        secure = isinstance(algorithm, SecureAggregation)
        if secure:  # each rank masks and sums its clients; the pads cancel in one int64 all-reduce
            if screened.dropped or screened.rejected or refused:
                raise RuntimeError(f"Round {round_idx}: secure aggregation under client sharding lost an update it cannot recover.")
            dropped = algorithm.dropped_clients(round_idx)
            masked_total = self._sharding.sum_residues(algorithm.masked_sum(round_idx, updates, dropped, self.global_state))
        summed = isinstance(algorithm, SupportsWeightedSum) and not gathers and not secure
        partial = algorithm.weighted_delta_sum(updates) if summed and updates else ({}, 0.0)  # type: ignore[union-attr]
        combined = self._sharding.all_reduce(
            clients,
            local,
            dropped_ids=set(screened.dropped),
            rejected_ids={*screened.rejected, *refused},
            partial=partial,
            template=self.global_state,
            stop=self.trainer.received_sigterm,
        )
        if combined.stop:
            raise SIGTERMException
        # The logging step counts every client's steps, as one process would, not this rank's share.
        compat.count_steps(self.trainer, sum(r.num_steps for r in combined.reports) - sum(u.num_steps for u in local))
        aggregated = len(clients) - combined.dropped - combined.rejected
        metrics, rolled_back = {}, False

        def server_step() -> dict[str, float]:
            if secure:
                return algorithm.apply_masked_sum(round_idx, self.global_state, masked_total, dropped)  # type: ignore[union-attr]
            if summed:
                total, weight = combined.total, combined.weight
                return apply_sum(algorithm, round_idx, self.global_state, total, weight, combined.aggregated)  # type: ignore[arg-type]
            # Every rank aggregates the same gathered updates, in selection order, as one process would.
            everyone = [replace(r, payload=payloads[r.client_id]) for r in combined.reports if r.client_id in payloads]
            return algorithm.aggregate(round_idx, self.global_state, everyone)

        if aggregated or algorithm.aggregates_empty_rounds:
            metrics, rolled_back = aggregate_or_roll_back(round_idx, algorithm, self.global_state, server_step)
        counts = {"dropped": combined.dropped, "rejected": combined.rejected, "rolled_back": rolled_back}
        return combined.reports, self._finish_aggregation(round_idx, metrics, aggregated=aggregated, **counts)

    def _bound(
        self, round_idx: int, clients: list[int], updates: list[ClientUpdate]
    ) -> tuple[list[ClientUpdate], list[int]]:
        """``updates`` after the update bound, and the ids it rejects. Under client sharding, a bound
        that compares updates sees the norms of every rank's updates (of the round's ``clients``)."""
        bound = self.update_bound
        if bound is None:
            return updates, []
        if self._sharding is None or not bound.needs_all_norms:
            return bound_updates(bound, round_idx, updates)
        norms = self._sharding.gather_norms(clients, {u.client_id: update_norm(u.payload) for u in updates})
        scale_of = dict(zip(norms, bound.scales(list(norms.values()))))
        return apply_bound(bound, round_idx, updates, [scale_of[u.client_id] for u in updates])

    def _finish_aggregation(
        self, round_idx: int, metrics: dict[str, float], *, aggregated: int, dropped: int, rejected: int, rolled_back: bool
    ) -> dict[str, float]:
        if not aggregated:
            empty = self.algorithm.aggregates_empty_rounds  # e.g. DP releases its noise all the same
            outcome = f"{type(self.algorithm).__name__} aggregates the empty round" if empty else "the global model is unchanged"
            rank_zero_warn(f"Round {round_idx}: no client update to aggregate; {outcome}.")
        self._load_global_model()
        self._rounds_done = round_idx + 1
        return {
            "aggregated_clients": float(aggregated),
            "dropped_clients": float(dropped),
            "rejected_clients": float(rejected),
            "rolled_back": float(rolled_back),
            **metrics,
            **self.federation.services.pop_round_metrics(),
        }

    def end_round(
        self, round_idx: int, started: float, received: list[ClientUpdate], download_bytes: int, metrics: dict[str, float]
    ) -> None:
        """Epoch LR schedulers, server evaluation, and the round's metrics, validation's included,
        to every logger as one row (:func:`~fl_lightning.loops.round_log.log_round`)."""
        self._in_round = False
        upload_bytes = sum(u.upload_bytes for u in received)
        self.total_upload_bytes += upload_bytes
        self.total_download_bytes += download_bytes
        compat.step_epoch_schedulers(self)
        assert self._schedules is not None, "rounds end once the fit has set up the federation"
        self._schedules.end_round(round_idx)
        metrics.update(self.algorithm.evaluate(round_idx, self.trainer.lightning_module))
        validation = compat.run_server_validation(self) or {}
        metrics = {
            "round/clients": float(len(received)),
            "round/upload_bytes": float(upload_bytes),
            "round/download_bytes": float(download_bytes),
            "round/total_upload_bytes": float(self.total_upload_bytes),
            "round/total_download_bytes": float(self.total_download_bytes),
            "round/wall_time_s": time.perf_counter() - started,
            **client_means(received, TRAINING_METRICS),
            **{f"round/{k}": v for k, v in metrics.items()},
        }
        if self.algorithm.hides_client_statistics:
            metrics = without_client_statistics(metrics)
        log_round(self.trainer, round_idx, {**validation, **metrics})
        call_federated_hook(self.trainer, "on_round_aggregated", round_idx, metrics)

    def _select(self, round_idx: int) -> list[int]:
        clients = list(self.algorithm.select_clients(round_idx))
        num_clients = self.federation.num_clients
        if len(set(clients)) != len(clients) or any(not 0 <= c < num_clients for c in clients):
            raise ValueError(
                f"{type(self.algorithm).__name__}.select_clients returned {clients}: "
                f"client ids must be distinct and in 0..{num_clients - 1}."
            )
        del self.history[round_idx - self.history_start :]  # a re-run round (resumed mid-round) replaces its record
        self.history.append(clients)
        return clients

    def train_clients(self, round_idx: int, clients: list[int]) -> list[ClientUpdate]:
        """Trains the round's clients from the current global weights with the run's executor
        (one after another, in order, or with ``client_executor="batched"`` several at once);
        returns their updates in order."""
        assert self._executor is not None, "clients train once the fit has set up the federation"
        return self._executor.train([self.client_context(round_idx, cid) for cid in clients], self.global_state)

    def train_client(self, round_idx: int, cid: int, *, seed: int | None = None) -> ClientUpdate:
        """Trains client ``cid`` from the current global weights and returns its update.

        The global state is unchanged; the module is left holding the client's weights. The
        client's data order comes from ``seed`` (default: derived from the round and client).
        """
        assert self._executor is not None, "clients train once the fit has set up the federation"
        return self._executor.train([self.client_context(round_idx, cid, seed=seed)], self.global_state)[0]

    def train_client_later(self, round_idx: int, cid: int, *, seed: int | None = None) -> None:
        """As :meth:`train_client`, its update unread: the executor may train it with other such runs
        (:meth:`~fl_lightning.loops.client_executor.ClientExecutor.train_later`)."""
        assert self._executor is not None, "clients train once the fit has set up the federation"
        self._executor.train_later([self.client_context(round_idx, cid, seed=seed)], self.global_state)

    def steps_per_round(self) -> int:
        """The most optimizer steps a client takes in a round (its local work, cut to ``limit_train_batches``,
        over ``accumulate_grad_batches``): one round of a step-interval LR schedule
        (:class:`~fl_lightning.models.schedulers.RoundStepSchedules`)."""
        trainer = self.trainer
        data = require_federated_data(trainer.datamodule)

        def steps(cid: int) -> int:
            client = ClientContext(
                round_idx=0, client_id=cid, num_samples=data.client_num_samples(cid), num_epochs=self.local_epochs,
                num_steps=self.local_steps, seed=0,
            )
            return math.ceil(len(round_batches(data, client, trainer)) / trainer.accumulate_grad_batches)

        return max(steps(cid) for cid in range(data.num_clients))

    def client_context(self, round_idx: int, cid: int, *, seed: int | None = None) -> ClientContext:
        """The context of client ``cid`` in round ``round_idx``, its local work planned by the algorithm; its data
        seed defaults to one derived from both."""
        client = ClientContext(
            round_idx=round_idx,
            client_id=cid,
            num_samples=int(self.federation.num_samples[cid]),
            num_epochs=self.local_epochs,
            num_steps=self.local_steps,
            seed=derive_seed(self.seed, "client", round_idx, cid) if seed is None else seed,
        )
        self.algorithm.plan_client(client)
        return client

    def client_batches(self, client: ClientContext) -> Sized:
        """The client's local batch stream for this round, ordered by ``client.seed`` (an iterable
        without a length, such as a generator, is read into a list): its first
        ``limit_train_batches`` batches (which ``overfit_batches`` and ``fast_dev_run`` set) when that is
        fewer (:func:`~fl_lightning.trainer_arguments.batches_per_round`). With ``overfit_batches``, as
        Lightning overfits the same batches every epoch, a client's order is drawn from a seed of its
        own, the same every round."""
        if self.trainer.overfit_batches:
            client = replace(client, seed=derive_seed(self.seed, "overfit", client.client_id))
        return round_batches(self.federation.data, client, self.trainer)

    @override
    def on_save_checkpoint(self) -> dict:
        state = super().on_save_checkpoint()
        history, history_start = self._saved_history(len(self.history))
        federated: dict[str, Any] = {
            "fingerprint": dict(self._fingerprint),
            "rounds_done": self._rounds_done,
            "algorithm": self.algorithm.state_dict(),
            "history": history,
            "history_start": history_start,
            "total_upload_bytes": self.total_upload_bytes,
            "total_download_bytes": self.total_download_bytes,
        }
        # The module's weights are the global model except mid-round (they are a client's), when the
        # module's precision is below the master copy's, which holds the exact global model, or when they
        # are not in the default dtype: Lightning loads them into the module as constructed, before the
        # precision plugin converts it ("64-true"), so float64 weights would pass through float32.
        default = torch.get_default_dtype()
        if (
            self._in_round
            or any(t.dtype != self.global_state[k].dtype for k, t in self._live.items())
            or any(t.is_floating_point() and t.dtype != default for t in self._live.values())
        ):
            federated["global_state"] = {k: v.clone() for k, v in self.global_state.items()}
        if self._in_round:
            federated["round_start_steps"] = list(self._round_start_steps)
        if self.client_tensors and self.client_tensors.local:
            federated["local_tensors"] = self.client_tensors.store.state_dict()
        if self.kinds is not None and self.kinds.frozen:
            federated[frozen_base.ENTRY] = self._frozen_reference()
        state["federated"] = federated
        return state

    def _saved_history(self, length: int) -> tuple[list[list[int]], int]:
        """The newest of the first ``length`` history entries that a checkpoint keeps, and the round of the first."""
        history, start = kept_records(self.history[:length], self.history_start)
        # A secret sample's ids would undo its secrecy: only the number of rounds is kept.
        return [[] if self.algorithm.secret_sample else list(c) for c in history], start

    def _frozen_reference(self) -> frozen_base.FrozenReference:
        """The frozen tensors' names (aliases included) and digest, hashed again only when a frozen parameter was
        written to (its version counter moved): the base is hashed once per fit, not per checkpoint."""
        assert self.kinds is not None and self.client_tensors is not None
        kinds, every = self.kinds, live_tensors(self.trainer.lightning_module)
        parameters = {name: every[name] for name in kinds.frozen if name in kinds.parameters}
        versions = [t._version for t in parameters.values()]
        if self._frozen is None or self._frozen[0] != versions:
            # Frozen buffers are reloaded before every client: their master values are the initial ones.
            master = {**parameters, **{n: self.client_tensors.initial[n] for n in kinds.frozen if n not in parameters}}
            # Every name the checkpoint's state_dict holds, a tied alias under its own name: what the base file holds.
            values = {name: master[kinds.canonical(name)] for name in every if kinds.canonical(name) in master}
            self._frozen = (versions, {"names": list(values), "digest": frozen_base.frozen_digest(values)})
        return self._frozen[1]

    @override
    def on_load_checkpoint(self, state_dict: dict) -> None:
        super().on_load_checkpoint(state_dict)
        federated = state_dict.get("federated")
        validate_federated_state(federated, path=self.trainer.ckpt_path, max_rounds=self.max_epochs)
        self._rounds_done = federated["rounds_done"]
        self._loaded = federated
        # Lightning restores the loops before the optimizers, whose settings the checkpoint's would replace.
        self._optimization = optimization_fingerprint(self.trainer)

    def _restore(self, federated: dict[str, Any]) -> None:
        if "global_state" in federated:
            self.global_state = {k: v.to(self.global_state[k].device) for k, v in federated["global_state"].items()}
            self._load_global_model()
        if "local_tensors" in federated:
            assert self.client_tensors is not None
            self.algorithm.load_client_store(self.client_tensors.store, federated["local_tensors"], "local_tensors")
        path = self.trainer.ckpt_path
        validate_restored_state(federated, self.global_state, num_clients=self.federation.num_clients, path=path)
        try:
            self.algorithm.load_state_dict(federated["algorithm"])
            self.algorithm.check_restored(federated["rounds_done"])
        except InvalidStateError as err:
            raise CheckpointError(f"Checkpoint {path}: {type(self.algorithm).__name__}'s saved state is invalid: {err}") from err
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as err:
            raise CheckpointError(
                f"Checkpoint {self.trainer.ckpt_path}: {type(self.algorithm).__name__} cannot load the saved algorithm "
                f"state ({type(err).__name__}: {err}); was it written by another algorithm?"
            ) from err
        if "round_start_steps" in federated:  # saved mid-round: the replayed round counts its steps again
            global_step, logging_steps = federated["round_start_steps"]
            compat.rewind_step_counters(self.trainer, (global_step, logging_steps))
        self.history = [list(c) for c in federated["history"]]
        self.history_start = federated.get("history_start", 0)
        self.total_upload_bytes = int(federated["total_upload_bytes"])
        self.total_download_bytes = int(federated["total_download_bytes"])


def _spill_parent(trainer: pl.Trainer) -> str:
    """Where client stores spill: the experiment's folder, which a resumed run shares (so its start-up sweep finds
    the folders of a killed one), or ``default_root_dir`` without a logger, never the system's temporary folder
    (often memory-backed, which would defeat the budget)."""
    run = run_directory(trainer)
    return os.path.dirname(os.path.normpath(run)) if run is not None else trainer.default_root_dir
