"""``FederatedTrainer``: a Lightning ``Trainer`` whose ``fit`` runs federated rounds."""

from __future__ import annotations

import inspect
import os
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, Timer
from lightning.pytorch.callbacks.progress import ProgressBar
from lightning.pytorch.strategies import DDPStrategy, Strategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from fl_lightning.algorithms.shared.algorithm import Algorithm
from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.callbacks.progress import FederatedProgressBar
from fl_lightning.checkpointing.checkpoint_io import CheckedCheckpointIO
from fl_lightning.checkpointing import GlobalModelCheckpoint, find_last_checkpoint, round_checkpoint
from fl_lightning.data._data_checks import check_int
from fl_lightning.utils.checks import check_integer
from fl_lightning.data.federated import Federated
from fl_lightning.data.partitioners import Partitioner
from fl_lightning.distributed.strategy import FederatedDDPStrategy
from fl_lightning.server.federation import FederatedDataSource, require_federated_data
from fl_lightning.server.memory_budget import AUTO, parse_memory
from fl_lightning.loops.async_fit_loop import AsyncFitLoop
from fl_lightning.loops.batched_executor import batched_refusal, check_compile_backend
from fl_lightning.loops.federated_fit_loop import FederatedFitLoop
from fl_lightning.loops.hparams_session import one_tensorboard_session
from fl_lightning.trainer_arguments import MEANINGS, check_known_arguments, check_trainer_arguments
from fl_lightning.robust.update_bounds import UpdateBound
from fl_lightning.server.federated_parameters import FederatedParameters


class FederatedTrainer(pl.Trainer):
    """A ``Trainer`` for federated learning: ``max_epochs`` is the number of rounds (for an
    asynchronous algorithm such as FedBuff, the number of server aggregations).

    Everything else is Lightning's: accelerator, precision, callbacks (``on_train_epoch_end``,
    ``EarlyStopping`` and ``ModelCheckpoint(every_n_epochs)`` count rounds), loggers (the
    logging step is the round). Validation runs on the global model at the end of each round.
    Each Lightning argument is honoured, reinterpreted per round or refused with one ``ValueError``
    (:mod:`fl_lightning.trainer_arguments`, ``docs/lightning_integration.md``): ``max_steps``,
    ``max_time``, ``fast_dev_run`` and ``EarlyStopping`` end the fit at the end of a round, and however
    the fit ends the module holds the global model of the last completed round.

    ``fit`` takes a :class:`~fl_lightning.data.FederatedDataModule`, or any ``LightningDataModule``,
    which it federates as :class:`~fl_lightning.data.Federated` does: ``partitioner`` (default
    IID) over ``num_clients`` clients (default 10), seeded by ``seed``, and says so in the log.
    So ``LightningCLI(MyModule, MyDataModule, trainer_class=FederatedTrainer)`` works unchanged.

    With ``strategy="ddp"`` and several devices (or nodes), each process trains a share of every
    round's clients and one all-reduce per round combines them
    (:class:`~fl_lightning.distributed.FederatedDDPStrategy`, ``docs/distributed.md``); every
    process then validates on the whole validation set, so metrics equal a single process's.

    Args:
        algorithm: the federated algorithm (default :class:`~fl_lightning.FedAvg`).
        clients_per_round: clients per round, a count or a float fraction of all clients (default: all).
        local_epochs: local epochs per client per round (default 1 unless ``local_steps`` is set).
        local_steps: local optimizer steps per client per round, instead of epochs.
        seed: seed of client selection and of the clients' data order (and of the partition of a
            plain ``LightningDataModule`` given to ``fit``).
        num_clients: number of clients a plain ``LightningDataModule`` given to ``fit`` is split
            into (default 10); an error with federated data, which defines its own clients.
        partitioner: how a plain ``LightningDataModule`` given to ``fit`` is split (default
            :class:`~fl_lightning.data.IID`); an error with federated data.
        reset_optimizer: clear optimizer state (momentum, Adam moments) before every client.
        client_executor: which client executor trains each round's clients
            (:class:`~fl_lightning.loops.client_executor.ClientExecutor`; all see the same batches).
            ``"auto"`` (default) picks ``"lean"`` whenever it gives the weights of
            ``"lightning"`` bit for bit, else ``"lightning"``, and says which and why once
            (:mod:`fl_lightning.loops.executor_choice`; the run's first client always trains
            through Lightning's loop, which shows whether the module logs per step).
            ``"lightning"`` runs each client through Lightning's training-epoch loop (every hook
            and callback). ``"lean"`` calls the module's ``training_step`` and the optimizer
            directly, for speed, with the same weights; it skips the per-batch hooks of callbacks
            and module (``on_train_batch_start/end``, ``on_before/after_backward``,
            ``on_before_optimizer_step``, ``on_before_zero_grad``, ``on_before_batch_transfer``),
            gradient clipping and accumulation and per-step (``on_step``) logging, and warns once
            naming those it finds (each per-step metric once, after the client that first logs it; it steps ``interval="step"`` LR schedulers as Lightning does); it needs one optimizer,
            automatic optimization and a precision without gradient scaling.
            ``self.log(on_epoch=True)`` still works, and ``trainer.global_step`` advances after each
            optimizer step, as in Lightning's loop (a step returning ``None`` counts too).
            ``"batched"`` trains a round's clients together with ``torch.func.vmap``
            (:mod:`fl_lightning.loops.batched_executor`), clients
            with different sample and step counts included: plain ``torch.optim.SGD`` from the
            global weights only (algorithms that do not override ``configure_client``,
            ``reset_optimizer=True``), a ``training_step`` that ``vmap`` can run (no ``self.log``)
            and, when clients' batches differ in size (they are then padded and the padding
            masked out), whose loss is the mean of a per-sample loss over the batch (no summed
            loss, no BatchNorm in training mode; checked once, refused with a ``ValueError``);
            it warns once, naming them, about the per-batch hooks ``"lean"`` skips, about a precision
            other than 32/64-true (weights equal to that precision's rounding only) and about a
            ``training_step`` that reads ``self.global_step`` (it cannot advance within a client here).
        max_batched_clients: with ``client_executor="batched"``, at most this many clients train at
            once (each costs about three model copies of memory: weights, gradients, momentum);
            default: as many as half the device's free memory holds at four model copies per client,
            at most all of a round's clients (:mod:`fl_lightning.loops.batched_group_size`).
        compile_batched_steps: with ``client_executor="batched"``, run each step under ``torch.compile``
            (``True``: the ``"inductor"`` backend; a string names another backend, e.g. ``"aot_eager"``).
            A group's steps then all take one shape (every client, the largest batch, padded), so it
            compiles once per group size; worth it for long runs (compiling takes seconds to minutes).
        federated_parameters: which tensors are shared (sent, aggregated), frozen (never sent) or local (kept by
            each client): :class:`~fl_lightning.FederatedParameters`, by name pattern or module class. Default:
            trainable parameters are shared, frozen ones frozen, buffers follow their module; an algorithm may add
            its own (FedBN's local BatchNorm, FedPer's head). The fit summary lists the counts.
        update_bound: a bound on the clients' update norms applied before every aggregation (synchronous
            rounds, asynchronous buffers, sharded rounds): :class:`~fl_lightning.NormClip` or
            :class:`~fl_lightning.MedianNormFilter` (:mod:`fl_lightning.robust.update_bounds`); default none.
        allow_resume_changes: resume from a checkpoint whose federation (clients, partition, algorithm
            and its arguments, update bound, clients per round, seed, local work, model
            hyper-parameters, optimizer and LR-scheduler settings, datamodule arguments) differs
            from this run's, with a warning listing the changes; by default such a resume is
            refused (:mod:`fl_lightning.checkpointing.fingerprint`).
        client_state_memory: host memory that the algorithm's per-client state (FedSoft's personalised models,
            control variates, ...: :class:`~fl_lightning.server.client_store.ClientStore`) may take, beyond which
            the least recently used clients' entries spill to disk in the run folder (or the system's temporary
            folder without a logger), deleted with the store (at the latest when the process exits); bytes (int), text such as ``"2GB"`` or
            ``"512MiB"``, ``"auto"`` (default: a quarter of the machine's memory) or ``None`` (no limit). Results do
            not depend on it, only memory and speed (``docs/client_state.md``).
        use_distributed_sampler: must be ``False`` (the default). The loop shards clients over the
            processes itself and every rank evaluates the whole validation set; Lightning's
            ``DistributedSampler`` would split the evaluation data across ranks, so the logged
            metrics would differ from a single process's. ``True`` raises ``ValueError`` rather than
            being overridden silently, since it cannot be honoured.
        callbacks: Lightning callbacks; the trainer adds its progress bar (unless one is given
            or ``enable_progress_bar=False``), a ``ModelCheckpoint`` that keeps the latest round's
            ``round_<r>.ckpt`` and ``last.ckpt`` (unless one is given or ``enable_checkpointing=False``;
            :mod:`fl_lightning.checkpointing`) and
            :class:`~fl_lightning.checkpointing.GlobalModelCheckpoint`; its fit loop adds its
            client-loss recorder (:class:`~fl_lightning.callbacks.ClientLossRecorder`).
        **kwargs: forwarded to :class:`lightning.pytorch.Trainer`.

    Example::

        trainer = FederatedTrainer(algorithm=FedProx(mu=0.01), clients_per_round=10, max_epochs=200)
        trainer.fit(model, datamodule=FederatedDataModule(Digits(), partitioner=Dirichlet(0.5), num_clients=20))
    """

    def __init__(
        self,
        *,
        algorithm: Algorithm | None = None,
        clients_per_round: int | float = 1.0,
        local_epochs: int | None = None,
        local_steps: int | None = None,
        seed: int = 0,
        num_clients: int | None = None,
        partitioner: Partitioner | None = None,
        reset_optimizer: bool = True,
        client_executor: Literal["auto", "lightning", "lean", "batched"] = "auto",
        max_batched_clients: int | None = None,
        compile_batched_steps: bool | str = False,
        update_bound: UpdateBound | None = None,
        federated_parameters: FederatedParameters | None = None,
        allow_resume_changes: bool = False,
        client_state_memory: int | str | None = AUTO,
        use_distributed_sampler: bool = False,
        callbacks: list[Callback] | Callback | None = None,
        **kwargs: Any,
    ) -> None:
        if local_epochs is not None and local_steps is not None:
            raise ValueError(
                f"Set either `local_epochs` or `local_steps`, not both (got local_epochs={local_epochs}, "
                f"local_steps={local_steps})."
            )
        for name, value in (("local_epochs", local_epochs), ("local_steps", local_steps)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        if (
            isinstance(clients_per_round, bool)
            or not isinstance(clients_per_round, (int, float))
            or not clients_per_round > 0  # NaN too
            or (isinstance(clients_per_round, float) and clients_per_round > 1)
        ):
            raise ValueError(
                f"`clients_per_round` must be a positive count or a fraction in (0, 1], got {clients_per_round!r}."
            )
        if client_executor not in ("auto", "lightning", "lean", "batched"):
            raise ValueError(f"`client_executor` must be 'auto', 'lightning', 'lean' or 'batched', got {client_executor!r}.")
        if client_executor == "batched" and algorithm is not None and (refusal := batched_refusal(algorithm)):
            raise ValueError(refusal)  # an algorithm's own reason, at once (an asynchronous one never reaches an executor)
        if max_batched_clients is not None and (
            client_executor != "batched" or isinstance(max_batched_clients, bool) or not isinstance(max_batched_clients, int)
            or max_batched_clients < 1
        ):
            raise ValueError(
                f"`max_batched_clients` must be a positive integer with client_executor='batched', got "
                f"{max_batched_clients!r} with client_executor={client_executor!r}."
            )
        check_compile_backend(compile_batched_steps, client_executor)
        seed = check_integer("seed", seed, minimum=0, maximum=2**64 - 1)  # derive_seed's range
        self._num_clients = None if num_clients is None else check_int("num_clients", num_clients, minimum=1)
        if partitioner is not None and not isinstance(partitioner, Partitioner):
            raise TypeError(
                f"`partitioner` must be an fl_lightning.data.Partitioner (IID, Dirichlet, Shards, ...) or None, "
                f"got {type(partitioner).__name__}."
            )
        self._partitioner = partitioner
        if update_bound is not None and not isinstance(update_bound, UpdateBound):
            raise TypeError(
                f"`update_bound` must be an fl_lightning.robust.update_bounds.UpdateBound (NormClip, MedianNormFilter) "
                f"or None, got {type(update_bound).__name__}."
            )
        if federated_parameters is not None and not isinstance(federated_parameters, FederatedParameters):
            raise TypeError(
                f"`federated_parameters` must be an fl_lightning.FederatedParameters or None, got "
                f"{type(federated_parameters).__name__}."
            )
        if not isinstance(allow_resume_changes, bool):
            raise TypeError(f"`allow_resume_changes` must be a bool, got {allow_resume_changes!r}.")
        # A parameter rather than part of **kwargs, so that LightningCLI's default is False as well.
        if use_distributed_sampler is not False:
            raise ValueError(
                f"`use_distributed_sampler` must be False under FederatedTrainer, got {use_distributed_sampler!r}: "
                "the loop shards clients over the processes itself, and a DistributedSampler would split the "
                "server's evaluation data across ranks (metrics would differ from one process's)."
            )
        check_known_arguments(kwargs, _FEDERATION_ARGUMENTS)
        check_trainer_arguments(kwargs)
        state_memory = parse_memory(client_state_memory)
        algorithm = algorithm if algorithm is not None else FedAvg()
        keeps_local = any(
            selection is not None and selection.patterns["local"]
            for selection in (federated_parameters, algorithm.federated_parameters())
        )
        if client_state_memory != AUTO and not algorithm.client_stores() and not keeps_local:
            rank_zero_warn(
                f"`client_state_memory={client_state_memory!r}` has no effect: {type(algorithm).__name__} keeps no "
                "per-client state in a ClientStore, and no tensor is selected as local."
            )

        kwargs["strategy"] = _federated_strategy(kwargs.get("strategy", "auto"))
        callbacks = [callbacks] if isinstance(callbacks, Callback) else list(callbacks or [])
        if kwargs.get("enable_progress_bar", True) is not False and not any(isinstance(c, ProgressBar) for c in callbacks):
            callbacks.append(FederatedProgressBar())
        # Not under fast_dev_run, which writes nothing: Lightning's on_train_end would still save its `last.ckpt`.
        writes = kwargs.get("enable_checkpointing", True) is not False and not kwargs.get("fast_dev_run", False)
        if writes and not any(isinstance(c, ModelCheckpoint) for c in callbacks):
            callbacks.append(round_checkpoint(asynchronous=algorithm.asynchronous))
        callbacks.append(GlobalModelCheckpoint())
        if kwargs.get("max_time") is not None:
            # Lightning's own Timer checks after every batch, which only the Lightning executor runs, and
            # would stop inside a round: checked at round ends, the fit stops after the round that reached it.
            callbacks.append(Timer(duration=kwargs.pop("max_time"), interval="epoch"))
        try:
            super().__init__(callbacks=callbacks, use_distributed_sampler=False, **kwargs)
        except MisconfigurationException as err:  # a configuration error like any other: one ValueError
            raise ValueError(str(err)) from None
        # A truncated, corrupt or foreign checkpoint then fails with one error naming the file, and a resume's
        # checkpoint is checked against this run before Lightning loads anything from it.
        self.strategy.checkpoint_io = CheckedCheckpointIO(self.strategy.checkpoint_io, before_restore=self._before_restore)

        previous = self.fit_loop
        loop_class = AsyncFitLoop if algorithm.asynchronous else FederatedFitLoop
        self.fit_loop = loop_class(
            self,
            min_epochs=previous.min_epochs,
            max_epochs=previous.max_epochs,
            algorithm=algorithm,
            clients_per_round=clients_per_round,
            local_epochs=local_epochs if local_steps is not None or local_epochs is not None else 1,
            local_steps=local_steps,
            seed=seed,
            reset_optimizer=reset_optimizer,
            client_executor=client_executor,
            max_batched_clients=max_batched_clients,
            compile_backend="inductor" if compile_batched_steps is True else compile_batched_steps or None,
            update_bound=update_bound,
            federated_parameters=federated_parameters,
            allow_resume_changes=allow_resume_changes,
            client_state_memory=state_memory,
            min_steps=previous.epoch_loop.min_steps,
            max_steps=previous.epoch_loop.max_steps,
        )

    @property
    @override
    def estimated_stepping_batches(self) -> int | float:
        """The optimizer steps of one client's step-interval LR schedule over the whole fit: ``max_epochs``
        rounds times the most steps a client takes in a round (``inf`` with ``max_epochs=-1``). Every client
        of a round starts from the round's point of the schedule, which moves on one round at its end
        (:class:`~fl_lightning.models.schedulers.RoundStepSchedules`), so
        ``CosineAnnealingLR(optimizer, T_max=trainer.estimated_stepping_batches)`` with ``interval="step"``
        ends at the last step of the last round."""
        rounds = self.fit_loop.max_epochs
        if rounds is None or rounds == -1:
            return float("inf")
        return max(rounds, 1) * self.fit_loop.steps_per_round()

    @property
    def algorithm(self) -> Algorithm:
        """The federated algorithm."""
        return self.fit_loop.algorithm

    @override
    def fit(
        self,
        model: pl.LightningModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: pl.LightningDataModule | None = None,
        ckpt_path: str | os.PathLike[str] | None = None,
        weights_only: bool | None = None,
    ) -> None:
        """Lightning's ``fit``; ``ckpt_path="last"`` resumes from this run's own checkpoints, else
        the experiment's most recent run, falling back from a broken ``last.ckpt`` to the newest
        intact round (:func:`~fl_lightning.checkpointing.find_last_checkpoint`), and starts from
        scratch with Lightning's warning when there is none. A plain
        ``LightningDataModule`` is federated first (see the class docstring). A ``TensorBoardLogger``
        writes the fit's hyper-parameters (the module's, the CLI's config, the federated ``fl/*`` keys) as one
        session (:mod:`~fl_lightning.loops.hparams_session`)."""
        datamodule = self._federated(datamodule) if train_dataloaders is None else datamodule
        if datamodule is None:
            require_federated_data(train_dataloaders)  # fails now, not after the strategy's set-up
        if ckpt_path == "last":
            ckpt_path = find_last_checkpoint(self) or ckpt_path
        with one_tensorboard_session(self):  # TensorBoard's HPARAMS tab shows a run's first session only
            super().fit(model, train_dataloaders, val_dataloaders, datamodule, ckpt_path, weights_only)

    def _before_restore(self, checkpoint: dict[str, Any], path: Any) -> None:
        """A checkpoint ``fit`` resumes from, checked by the federated loop (state and fingerprint) before
        Lightning loads its weights into the module; ``validate``/``test``/``predict`` read weights only."""
        if self.state.fn == TrainerFn.FITTING and isinstance(self.fit_loop, FederatedFitLoop):
            self.fit_loop.check_checkpoint(checkpoint, path)

    def _federated(self, datamodule: pl.LightningDataModule | None) -> pl.LightningDataModule | None:
        """``datamodule`` if it is federated, else federated with ``num_clients`` and ``partitioner``."""
        if isinstance(datamodule, FederatedDataSource):
            given = {"num_clients": self._num_clients, "partitioner": self._partitioner}
            given = {name: value for name, value in given.items() if value is not None}
            if given:
                raise ValueError(
                    f"FederatedTrainer({', '.join(f'{k}={v!r}' for k, v in given.items())}) federates a plain "
                    f"LightningDataModule, but {type(datamodule).__name__} already defines its clients: set them "
                    "there, or drop them from the trainer."
                )
            return datamodule
        if not isinstance(datamodule, pl.LightningDataModule):
            return datamodule
        federated = Federated(
            datamodule,
            partitioner=self._partitioner,
            num_clients=10 if self._num_clients is None else self._num_clients,
            seed=self.fit_loop.seed,
        )
        rank_zero_info(
            f"FederatedTrainer federates {type(datamodule).__name__}: {federated.partitioner!r} over "
            f"{federated.num_clients} clients (seed {federated.seed}); set FederatedTrainer(num_clients=..., "
            "partitioner=...) to change it."
        )
        return federated


#: ``FederatedTrainer``'s own arguments, beside Lightning ``Trainer``'s, for :func:`check_known_arguments`'s message.
_FEDERATION_ARGUMENTS = tuple(
    name for name in inspect.signature(FederatedTrainer.__init__).parameters if name not in ("self", "kwargs", *MEANINGS)
)


def _federated_strategy(strategy: str | Strategy) -> str | Strategy:
    """Lightning's DDP strategies become :class:`FederatedDDPStrategy`: ranks train different clients."""
    if isinstance(strategy, str) and strategy.startswith("ddp"):
        return FederatedDDPStrategy.from_name(strategy)
    if isinstance(strategy, DDPStrategy) and not isinstance(strategy, FederatedDDPStrategy):
        raise ValueError(
            f"{type(strategy).__name__} all-reduces gradients on every step, but each process trains different "
            "clients: use strategy='ddp' or FederatedDDPStrategy(...) (same arguments)."
        )
    return strategy
