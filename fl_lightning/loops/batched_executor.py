"""``client_executor="batched"``: several clients' local SGD at once with ``torch.func``, ragged clients included.

The weights of ``K`` clients are stacked along a new leading dimension and their local steps run
together: per step, one ``vmap`` over ``grad_and_value`` of the module's own ``training_step``
(called through ``functional_call``), then a functional SGD update of the stacked weights
(:mod:`~fl_lightning.loops.batched_sgd`). Each client's update equals the sequential
executors' to float rounding: the same batches in the same order (a ``training_step`` that draws random numbers
agrees in distribution only, and a parameter kept outside the module's registered tensors is refused:
:mod:`~fl_lightning.loops.batched_exactness`).

*Ragged clients* (other numbers of steps, other batch sizes) train together:

* a group's clients are sorted by their number of steps, most first, so the clients still
  training at step ``t`` are a prefix ``[:n_t]`` of the stack; only that prefix is computed and
  updated (weights, momentum buffers, weight decay: a finished client's tensors are not touched,
  so they stay where its last step, as in sequential training, left them);
* at a step whose batches differ in size, each client's batch is padded to the largest (with
  copies of its first sample) and ``training_step`` runs per sample (an inner ``vmap``), the
  loss being ``sum(mask * per-sample loss) / real samples``: the mean over the real samples, so
  the padded copies get no gradient. This needs a ``training_step`` that returns the mean of a
  per-sample loss over the batch (:func:`check_mean_step`, run once, refuses others).

*Compiled steps* (``compile_backend``, e.g. ``"inductor"``): each step, ``vmap(grad_and_value)``
of the loss, forward and backward, runs under ``torch.compile``, which compiles anew for each new shape. So that a group
compiles once, every step of it runs in one shape: all the group's clients (a finished client
gets a batch of padding only, whose update is dropped), each batch padded to the group's largest
(the mean-step check applies). Recompiles are bounded by the group sizes a round brings (a full
group and the last one) and, once, a ``batch_idx`` that becomes a symbolic integer.

*Local tensors* (:class:`~fl_lightning.FederatedParameters` ``local``: FedBN's BatchNorm layers, FedPer's head):
each member's own, loaded from the client store by its ``start_client``, is copied into its row of the stack
before the group trains, and written back to the store from its row by its ``finish_client``; so are all of its
weights where the algorithm's ``configure_client`` loads the client's own (``configure_client_loads_weights``:
Ditto's personal model), and the tensors a mixin keeps outside ``state_dict`` for the round (FedMRN's latent update
and noise, whose per-step masks each client draws from its own generator before the step:
:mod:`~fl_lightning.loops.batched_terms`). BatchNorm trains
in training mode under ``vmap``: each client normalises with its own batch's statistics and updates its own
running statistics (its row of the stacked buffers), as alone; in a padded step, with the statistics of its real
samples only (:mod:`~fl_lightning.loops.batched_batch_norm`; eager steps only). A client's batch of one sample, which torch's BatchNorm
refuses in training where it gets one value per channel, raises the sequential executors' ``ClientDataError``.

Extra memory: the stacked weights, gradients (and momentum buffers) and activations of one
group of at most ``max_batched_clients`` clients, about ``3 K`` models; by default the fit's first client trains
alone, its forward outputs are measured, and ``K`` is as many as half the device's free memory holds, activations
counted, and on a CPU as many as keep the group's activations within a cache-friendly bound
(:mod:`~fl_lightning.loops.batched_group_size`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn
from torch.utils._pytree import TreeSpec, tree_flatten
from typing_extensions import override

from fl_lightning import _lightning_compat as compat
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper, wrapped
from fl_lightning.loops.batched_activations import ForwardBytes
from fl_lightning.loops.batched_adam import adam_step
from fl_lightning.loops.batched_batch_norm import RealSampleNorms
from fl_lightning.loops.batched_exactness import (
    RandomCalls,
    check_group_settings,
    optimizer_settings,
    warn_dropout,
    warn_random_calls,
)
from fl_lightning.loops.batched_group_size import free_memory, group_size
from fl_lightning.loops.batched_sgd import (
    BatchedStep,
    StackedState,
    batched_step,
    call_training_step,
    logging_skipped,
    sgd_step,
    step_count_reads,
    unflatten,
)
from fl_lightning.loops.batched_terms import GroupTerms, TermInputs, bound
from fl_lightning.loops.client_executor import ONE_VALUE_PER_CHANNEL, ClientExecutor, ClientRuntime, one_sample_batch_error
from fl_lightning.loops.lean_executor import StepSchedulers
from fl_lightning.mixins._holders import holder_tensors
from fl_lightning.server.model_state import State, load_into

__all__ = [
    "BatchedExecutor", "batched_refusal", "check_batched_support", "check_compile_backend", "check_compiled_batch_norm",
    "check_compiled_holders", "check_mean_step", "flatten_stream", "group_clients",
    "warn_rounding",
]

PREFIX = "client_executor='batched'"


#: The optimizers the batched executor steps (options: ``batched_sgd.SGD_OPTIONS``, ``batched_adam.ADAM_OPTIONS``).
OPTIMIZERS = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


def configure_client_definer(algorithm: Algorithm) -> type:
    """The class that defines ``algorithm``'s ``configure_client``, whose declarations
    (``configure_client_sets_terms``, ``configure_client_loads_weights``) the batched executor reads; through a wrapper
    whose ``configure_client`` is :class:`AlgorithmWrapper`'s, which only passes the call on (DPFedAvg, LocalDP, the
    robust rules, Byzantine, SecureAggregation, FedALIGN: what they add runs before or after local training), the
    wrapped algorithm's."""
    layer = algorithm
    while True:
        definer = next(cls for cls in type(layer).__mro__ if "configure_client" in vars(cls))
        if definer is not AlgorithmWrapper:
            return definer
        layer = layer.inner  # type: ignore[attr-defined]


def batched_refusal(algorithm: Algorithm) -> str | None:
    """The error for the first of ``algorithm`` and the algorithms it wraps, outermost first, that declares a
    :attr:`~Algorithm.batched_refusal`; ``None`` when none does."""
    for layer in wrapped(algorithm):
        if layer.batched_refusal:
            inside = "" if layer is algorithm else f" (inside {type(algorithm).__name__})"
            return (
                f"{PREFIX} cannot train {type(layer).__name__}{inside}: {layer.batched_refusal} "
                "Use client_executor='lightning' or 'lean'."
            )
    return None


def check_batched_support(runtime: ClientRuntime) -> torch.optim.Optimizer:
    """Raises a ``ValueError`` naming what the batched executor cannot reproduce; returns the optimizer."""
    trainer, module, algorithm = runtime.trainer, runtime.module, runtime.algorithm
    if refusal := batched_refusal(algorithm):
        raise ValueError(refusal)
    definer = configure_client_definer(algorithm)
    if definer is not Algorithm and not vars(definer).get("configure_client_sets_terms", False):
        raise ValueError(
            f"{PREFIX} calls each client's configure_client before its group trains, which is exact for one that at "
            "most sets the module's loss terms and loads the client's own weights, as its class declares "
            "(configure_client_sets_terms = True, and configure_client_loads_weights: FedProx, SCAFFOLD, FedDyn, "
            f"Ditto, ...); {definer.__name__}.configure_client (of {type(algorithm).__name__}) does not declare it, so "
            "what it does is unknown. Declare it if that is all it does, or use client_executor='lightning' or 'lean'."
        )
    if not runtime.reset_optimizer:
        raise ValueError(f"{PREFIX} needs reset_optimizer=True (fresh optimizer state per client).")
    if not module.automatic_optimization or len(trainer.optimizers) != 1:
        raise ValueError(f"{PREFIX} needs automatic optimization with exactly one optimizer.")
    optimizer = trainer.optimizers[0]
    if type(optimizer) not in OPTIMIZERS:
        raise ValueError(
            f"{PREFIX} steps torch.optim.SGD, Adam and AdamW only; got {type(optimizer).__module__}."
            f"{type(optimizer).__qualname__}. Use client_executor='lightning' (or 'lean')."
        )
    unsupported = {
        "gradient_clip_val": trainer.gradient_clip_val or None,
        "accumulate_grad_batches": trainer.accumulate_grad_batches if trainer.accumulate_grad_batches != 1 else None,
        "an interval='step' ReduceLROnPlateau scheduler": next(
            (c.scheduler for c in trainer.lr_scheduler_configs if c.interval == "step" and c.reduce_on_plateau), None
        ),
        "gradient scaling": getattr(trainer.precision_plugin, "scaler", None),
        # Batches are moved to the device stacked (leading client dimension); a user's hook would see that.
        "overridden batch-transfer hooks": compat.overridden_batch_hooks(trainer) or None,
    }
    for what, value in unsupported.items():
        if value is not None:
            raise ValueError(
                f"{PREFIX} does not support {what} (got {value!r}); use client_executor='lightning' (or 'auto', which "
                "picks it; 'lean' does not support it either)."
            )
    return optimizer


def check_compiled_holders(module: pl.LightningModule, compile_backend: str | None) -> None:
    """Refuses compiled steps for a module with weight-swapping holders (``MaskedNoiseMixin``: FedMRN), whose forward
    hooks and straight-through ``autograd.Function`` ``torch.compile`` cannot trace over ``vmap``."""
    if compile_backend is not None and holder_tensors(module):
        raise ValueError(
            f"{PREFIX} with compile_batched_steps={compile_backend!r} cannot train {type(module).__name__}: its masked "
            "weights are swapped for w + u_hat by forward hooks with a straight-through autograd.Function "
            "(MaskedNoiseMixin), which torch.compile cannot trace under vmap. Use compile_batched_steps=False (eager "
            "batched steps), or client_executor='lean'."
        )


def check_compiled_batch_norm(module: pl.LightningModule, compile_backend: str | None) -> None:
    """Refuses compiled steps for a module with BatchNorm layers: compiled steps pad every batch, and a padded step's
    BatchNorm reduces across the per-sample ``vmap`` with an ``autograd.Function``'s ``vmap`` rule
    (:mod:`~fl_lightning.loops.batched_batch_norm`), which ``torch.compile`` does not trace (every step would fall
    back to eager, after a failed trace)."""
    if compile_backend is None:
        return
    norms = [name for name, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if norms:
        raise ValueError(
            f"{PREFIX} with compile_batched_steps={compile_backend!r} cannot train {type(module).__name__}: its BatchNorm "
            f"layers ({', '.join(norms)}) normalise a padded batch over its real samples with a vmap rule that "
            "torch.compile cannot trace. Use compile_batched_steps=False (eager batched steps)."
        )


def check_compile_backend(value: object, client_executor: str) -> None:
    """Refuses a ``compile_batched_steps`` other than ``False``, ``True`` or a ``torch.compile``
    backend's name, or one given without the batched executor."""
    from torch._dynamo import list_backends  # only when asked for: importing torch._dynamo takes about a second

    if value is False or (client_executor == "batched" and (value is True or value in list_backends(exclude_tags=()))):
        return
    raise ValueError(
        f"`compile_batched_steps` must be True, False or a torch.compile backend ({', '.join(list_backends())}, "
        f"aot_eager, ...) with client_executor='batched', got {value!r} with client_executor={client_executor!r}."
    )


#: Precisions whose arithmetic the batched kernels reproduce to float32 rounding.
EXACT_PRECISIONS = ("32-true", "64-true")


def warn_rounding(trainer: pl.Trainer) -> None:
    """Says once that under a lower precision the weights equal the sequential executors' only to
    that precision's rounding: a batched matrix product rounds each output to ``bf16``/``fp16``
    after summing in another order, which moves it by one unit in the last place (about 1e-3)."""
    if str(trainer.precision) not in EXACT_PRECISIONS:
        rank_zero_warn(
            f"{PREFIX} with precision={trainer.precision!r} gives weights equal to the sequential executors' only to "
            "that precision's rounding (about 1e-3 after a few rounds), not to float32's: its batched kernels sum in "
            "another order before rounding. Use precision='32-true', or client_executor='lean' or 'lightning'."
        )


#: A client's batch stream, each batch flattened once into its tensors and their structure
#: (``tuple``/``list`` for the common flat batches, else a pytree spec).
FlatStream = list[tuple[list[Tensor], "type | TreeSpec"]]


def flatten_stream(batches: Iterable[Any]) -> FlatStream:
    """Each batch as ``(tensors, structure)``; raises a ``TypeError`` for a batch holding a non-tensor."""
    flat: FlatStream = []
    for batch in batches:
        if type(batch) in (tuple, list) and all(isinstance(t, Tensor) for t in batch):
            flat.append((list(batch), type(batch)))  # skips the pytree machinery: ~10% of a small step
            continue
        leaves, spec = tree_flatten(batch)
        if not all(isinstance(leaf, Tensor) for leaf in leaves):
            raise TypeError(f"{PREFIX} needs batches made of tensors only; got a batch of structure {spec}.")
        flat.append((leaves, spec))
    return flat


def group_clients(num_steps: Sequence[int], max_clients: int | None = None) -> list[list[int]]:
    """Positions of the clients, most steps first (ties in order), cut into groups of at most
    ``max_clients``: in a group, the clients still training at any step are a prefix."""
    order = sorted(range(len(num_steps)), key=lambda i: -num_steps[i])
    size = max_clients or len(order) or 1
    return [order[i : i + size] for i in range(0, len(order), size)]


def num_samples(leaves: Sequence[Tensor]) -> int:
    """The batch's number of samples: the common length of its tensors (one row per sample)."""
    sizes = {leaf.shape[0] if leaf.dim() else None for leaf in leaves}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            f"{PREFIX} pads clients' batches of unequal sizes, which needs every tensor of a batch to hold one row "
            f"per sample; got a batch of tensors with shapes {[tuple(leaf.shape) for leaf in leaves]}."
        )
    return int(sizes.pop())


def pad_batches(
    batches: Sequence[list[Tensor]], size: int | None = None, clients: int | None = None
) -> tuple[list[Tensor], Tensor]:
    """The clients' batches stacked, each padded to ``size`` samples (default: the largest) with
    copies of its first sample, and the ``[clients, samples]`` mask of the real samples; up to
    ``clients`` rows (default: one per batch), the extra ones copies of the first batch, all padding."""
    sizes = [num_samples(leaves) for leaves in batches]
    size = size or max(sizes)
    extra = (clients or len(batches)) - len(batches)
    batches = [*batches, *[batches[0]] * extra]
    sizes += [0] * extra
    stacked = [
        torch.stack([torch.cat([t[:n], t[:1].expand(size - n, *t.shape[1:])]) if n < size else t for t, n in zip(parts, sizes)])
        for parts in zip(*batches)
    ]
    mask = torch.arange(size) < torch.tensor(sizes).unsqueeze(1)
    return stacked, mask


@torch.no_grad()
def check_mean_step(module: pl.LightningModule, leaves: list[Tensor], structure: type | TreeSpec) -> None:
    """Refuses a ``training_step`` whose loss is not the mean of a per-sample loss over the batch
    (a sum, a batch-level term): padding would change its gradients.

    Compared on one batch in evaluation mode (so that dropout does not differ, and BatchNorm, whose padded steps
    normalise over the real samples, :mod:`~fl_lightning.loops.batched_batch_norm`, uses its running statistics):
    the step's loss on the batch, and the mean of its losses on each sample alone. BatchNorm without running
    statistics (``track_running_stats=False``) normalises with the batch's in evaluation mode too, so it is refused.
    A step that draws random numbers even in evaluation mode (noise) cannot be compared so, and is refused for that.
    """
    norms = [
        name for name, m in module.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training and m.running_mean is None
    ]  # fmt: skip
    if norms:
        raise ValueError(
            f"{PREFIX} trains clients with unequal batches by padding them, which needs a training_step whose loss is "
            f"a mean over the batch's samples, checked in evaluation mode; {type(module).__name__} has BatchNorm layers "
            f"without running statistics ({', '.join(norms)}), whose evaluation-mode statistics depend on the whole "
            "batch. Use client_executor='lean', or batches of equal shapes (local_steps with drop_last)."
        )
    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        with RandomCalls() as calls:
            whole = call_training_step(module, unflatten(leaves, structure), 0)
            samples = [unflatten([t[i : i + 1] for t in leaves], structure) for i in range(len(leaves[0]))]
            per_sample = torch.stack([call_training_step(module, sample, 0) for sample in samples])
    finally:
        for m, training in modes.items():
            m.training = training
    if calls.names:
        raise ValueError(
            f"{PREFIX} trains clients with unequal batches by padding them, which needs a training_step whose loss is "
            "the mean of a per-sample loss over the batch, checked once by comparing its loss on a batch with the mean "
            f"of its losses on each sample alone; {type(module).__name__}.training_step draws random numbers even in "
            f"evaluation mode ({', '.join(sorted(calls.names))}), so the two differ whatever the loss. Use batches of "
            "equal shapes (drop_last=True, equal local_steps), where its random draws are only named in a warning, or "
            "client_executor='lean' or 'lightning'."
        )
    if not torch.allclose(whole, per_sample.mean(), rtol=1e-4, atol=1e-6):
        raise ValueError(
            f"{PREFIX} trains clients with unequal batches by padding them, which needs a training_step whose loss is "
            f"the mean of a per-sample loss over the batch; {type(module).__name__}.training_step gave {float(whole):.6g} "
            f"on a batch of {len(per_sample)} samples, but {float(per_sample.mean()):.6g} as the mean of its losses on each "
            "sample alone. Use client_executor='lean', or make the loss a mean over the samples (reduction='mean')."
        )


class BatchedExecutor(ClientExecutor):
    """Trains a round's clients in groups of at most ``max_clients`` (``None``: as many as the
    device's free memory allows, :mod:`~fl_lightning.loops.batched_group_size`).

    Per group: ``on_client_start`` for each member (in the clients' order), their local steps at
    once, then per member, with the module holding its local weights, ``algorithm.client_update``
    and ``on_client_end``. Updates come back in the clients' order.
    """

    name = "batched"

    def __init__(self, runtime: ClientRuntime, *, max_clients: int | None = None, compile_backend: str | None = None) -> None:
        super().__init__(runtime)
        self.compile_backend = compile_backend
        self.max_clients = max_clients
        #: The default group size (:func:`group_size`), set once per fit after its first client, trained as a group of
        #: one, measured ``training_step``'s forward outputs; every later group is cut by it.
        self._default_size: int | None = None
        #: The bytes of the first client's forward outputs (:class:`ForwardBytes`), ``None`` until measured.
        self._forward_bytes: int | None = None
        self._steps: dict[tuple[type | TreeSpec, bool], BatchedStep] = {}
        self._mean_checked = False
        #: The dropout modules named when the fit starts (this executor is made then); the first step's note of random
        #: operations leaves their draws out.
        self._dropout = warn_dropout(runtime.module)
        self._randomness_checked = False
        self._logging_warned = False
        self._step_count_warned = False
        #: Whether a group is training (a train call inside one comes from ``client_update``: ``services.train_client``).
        self._training = False
        self._nested_warned = False
        #: While a group's clients compute their updates: the runs they ask for with ``services.train_client_later``.
        self._later: list[ClientContext] | None = None

    @override
    def train(self, clients: Sequence[ClientContext], global_state: State) -> list[ClientUpdate]:
        if self._training:
            self._warn_nested()
            return self._train(clients, global_state)
        self._training = True
        try:
            return self._train(clients, global_state)
        finally:
            self._training = False

    @override
    def train_later(self, clients: Sequence[ClientContext], global_state: State) -> None:
        """Held while a group's clients compute their updates (Ditto's personal passes), then trained as groups of
        their own before those clients end; at once otherwise."""
        if self._later is None:
            self.train(clients, global_state)
        else:
            self._later.extend(clients)

    def _train(self, clients: Sequence[ClientContext], global_state: State) -> list[ClientUpdate]:
        optimizer = check_batched_support(self.runtime)
        streams = [flatten_stream(self.runtime.batches(client)) for client in clients]
        updates: dict[int, ClientUpdate] = {}
        # Each member's own tensors, as its start_client leaves them: its local tensors (FedBN's BatchNorm, a personal
        # head) from the client store, and all its weights where configure_client loads them (Ditto's personal model).
        # And the tensors of its round outside state_dict (FedMRN's latent update u, at 0, and its noise).
        loads = vars(configure_client_definer(self.runtime.algorithm)).get("configure_client_loads_weights", False)
        rounds = holder_tensors(self.runtime.module)
        own_tensors = {**self.runtime.live, **self._local_tensors, **rounds} if loads else {**self._local_tensors, **rounds}
        for members in self._groups([len(stream) for stream in streams]):
            terms = GroupTerms()
            # The module holds only the last member's once all have started.
            own: dict[int, State] = {}
            # Each member's optimizer settings as it starts: the group steps with the last one's.
            settings: dict[int, list[dict[str, Any]]] = {}
            for i in sorted(members):
                self.start_client(clients[i], global_state)
                terms.add(self.runtime.module, clients[i].client_id)
                settings[clients[i].client_id] = optimizer_settings(optimizer)
                own[i] = {name: t.detach().clone() for name, t in own_tensors.items()}
            check_group_settings(settings)
            started = sorted(members)
            inputs = terms.inputs([started.index(i) for i in members], self.runtime.trainer.strategy.root_device)
            # The group's steps, mean-step check included.
            try:
                with logging_skipped(self.runtime.module) as logged, step_count_reads(self.runtime.module) as reads:
                    state, loss_sums = self._train_group(
                        optimizer, [streams[i] for i in members], terms, inputs, [own[i] for i in members], rounds
                    )
            except ValueError as error:
                if ONE_VALUE_PER_CHANNEL not in str(error):
                    raise
                one_sample = next((i for i in started if any(leaves[0].shape[:1] == (1,) for leaves, _ in streams[i])), None)
                if one_sample is None:
                    raise
                raise one_sample_batch_error(clients[one_sample]) from error
            self._warn_skipped_logging(logged)
            self._warn_step_count_read(reads.read)
            # The members' updates, then one group of the runs they ask for (services.train_client_later: Ditto's
            # personal passes), which end before the members do.
            later: list[ClientContext] = []
            self._later = later
            try:
                for j, i in sorted(enumerate(members), key=lambda member: member[1]):
                    self._note_steps(clients[i], len(streams[i]), loss_sums[j])
                    load_into({**self.runtime.live, **self._local_tensors, **rounds}, state.local_state(j))
                    terms.resume(self.runtime.module, started.index(i))
                    updates[i] = self.compute_update(clients[i], global_state)
            finally:
                self._later = None
            if later:
                self._train(later, global_state)
            for i in sorted(members):
                self.end_client(clients[i], updates[i])
        return [updates[i] for i in range(len(clients))]

    def _note_steps(self, client: ClientContext, steps: int, loss_sum: Tensor) -> None:
        """The client's optimizer steps (on the trainer's step axis too) and mean losses, from its summed
        ``(task loss, regularizer, steps with one)``."""
        client.completed_steps = steps
        compat.count_steps(self.runtime.trainer, steps)  # the step axis the other executors give
        if steps:
            # In float32, as the loss recorder averages the other executors' losses.
            task, regularizer, regularized = (loss_sum / steps).tolist()
            client.metrics["train_loss"] = task
            if regularized:
                client.metrics["train_regularizer"] = regularizer

    def _groups(self, num_steps: Sequence[int]) -> Iterator[list[int]]:
        """The round's groups (:func:`group_clients`), cut lazily: of ``max_clients``, or, by default, the fit's first
        client alone (its step measures the forward outputs) and then as few groups as :func:`group_size` allows,
        of equal sizes (49 clients under a bound of 24: 17 + 17 + 15, not 24 + 24 + 1)."""
        order = group_clients(num_steps)[0] if num_steps else []
        if self.max_clients is None and self._default_size is None and order and not self.compile_backend:
            yield order[:1]
            order = order[1:]
        size = self.max_clients
        if size is None and order:  # the default: as many groups as its bound needs, of sizes as equal as can be
            size = math.ceil(len(order) / math.ceil(len(order) / self._default_group_size()))
        yield from (order[i : i + size] for i in range(0, len(order), size or 1))

    def _default_group_size(self) -> int:
        if self._default_size is None:
            device = self.runtime.trainer.strategy.root_device
            self._default_size = group_size(
                self.runtime.live.values(), free_memory(device), clients=sys.maxsize,
                forward_bytes=self._forward_bytes or 0, on_cpu=device.type == "cpu",
            )  # fmt: skip
        return self._default_size

    def _train_group(
        self, optimizer: torch.optim.Optimizer, streams: Sequence[FlatStream], group_terms: GroupTerms,
        terms: TermInputs, own: Sequence[State], rounds: State,
    ) -> tuple[StackedState, Tensor]:
        """Trains one group of clients, sorted by their number of steps (most first), from the module's
        weights and each one's ``own`` local tensors (``rounds``: its round's tensors outside ``state_dict``), with
        their loss terms (``terms``, and ``group_terms``' per-step ones). Returns their stacked local state
        and each one's summed step ``(task loss, regularizer, steps with one)``."""
        trainer = self.runtime.trainer
        kinds = self.runtime.algorithm.federation.kinds
        # Each client gets its own copy of the frozen buffers too (a frozen BatchNorm in training mode updates its
        # statistics in place, which vmap refuses on an unstacked tensor); the copies are dropped after the group.
        frozen = self.runtime.client_tensors.frozen_buffers if self.runtime.client_tensors else {}
        tensors = {**self.runtime.live, **self._local_tensors, **frozen, **rounds}
        state = StackedState(tensors, optimizer, len(streams), kinds.aliases if kinds is not None else {})
        state.load_rows(own)
        # Momentum buffers (SGD) or moments (Adam, AdamW), stacked like the weights, by tensor name.
        optimizer_state: dict[str, Any] = {}
        adam = type(optimizer) is not torch.optim.SGD
        schedulers = StepSchedulers(trainer)
        precision = trainer.precision_plugin
        loss_sums = torch.zeros(len(streams), 3, device=trainer.strategy.root_device)
        # Compiled: one shape for the whole group (every client, the largest batch), so it compiles once.
        rows = None
        if self.compile_backend:
            rows = max((num_samples(leaves) for stream in streams for leaves, _ in stream), default=0)
        for batch_idx in range(len(streams[0]) if streams else 0):
            active = sum(len(stream) > batch_idx for stream in streams)  # a prefix: sorted by steps
            batches = [stream[batch_idx] for stream in streams[:active]]
            structure = batches[0][1]
            width = len(streams) if rows else active  # the clients the step runs: the active ones first
            per_client = {m: {n: t[:width] for n, t in ts.items()} for m, ts in terms[0].items()}
            if group_terms.stepping:  # drawn as the sequential executors draw them (64-true: float64 by default)
                with precision.train_step_context():
                    per_client.update(group_terms.step(self.runtime.module, state.by_name, active, width))
            step_terms = (per_client, terms[1])
            inputs, mask = self._stack([leaves for leaves, _ in batches], structure, rows, width, step_terms)
            trained = {name: t[:width] for name, t in state.trained.items()}
            others = {name: t[:width] for name, t in state.others.items()}
            step = self._step(state.tied, structure, padded=mask is not None)
            with precision.train_step_context(), self._noting_random_calls(), self._measuring_forward() as measured:
                grads, parts = self._run(
                    step, trained, others, step_terms, inputs, batch_idx, *(() if mask is None else (mask,))
                )
            if measured is not None:
                self._forward_bytes = measured.bytes
            if mask is not None and self._norms.one_value_per_sample and 1 in (num_samples(leaves) for leaves, _ in batches):
                raise ValueError(f"{ONE_VALUE_PER_CHANNEL} (a client's padded batch of 1 sample)")  # as torch's, alone
            if width > active:  # the finished clients' padding-only steps are dropped
                grads, parts = {name: g[:active] for name, g in grads.items()}, parts[:active]
            if batch_idx == 0:
                state.match_layout(grads)
            for group, params in state.groups:
                if adam:
                    adam_step(params, grads, optimizer_state, group, active, batch_idx + 1)
                else:
                    sgd_step(params, grads, optimizer_state, group, active)
            schedulers.step(batch_idx)
            loss_sums[:active] += parts.float()
        return state, loss_sums.cpu()

    @property
    def _local_tensors(self) -> State:
        """The module's local tensors (live), each client's own (``FederatedParameters`` ``local``); none without."""
        client_tensors = self.runtime.client_tensors
        return dict(client_tensors.local) if client_tensors else {}

    def _stack(
        self, batches: list[list[Tensor]], structure: type | TreeSpec, rows: int | None, clients: int, terms: TermInputs
    ) -> tuple[list[Tensor], Tensor | None]:
        """The clients' batches stacked on the device; padded, with the mask of the real samples,
        when their shapes differ or ``rows`` (to ``rows`` samples and ``clients`` clients) is given
        (``None``: no padding); the mean-step check runs with the first client's ``terms``."""
        if rows is None and len({tuple(t.shape for t in leaves) for leaves in batches}) == 1:
            return self._on_device([torch.stack(parts) for parts in zip(*batches)]), None
        self._check_mean_step(batches[0], structure, terms)
        stacked, mask = pad_batches(batches, rows, clients)
        return self._on_device(stacked), mask.to(self.runtime.trainer.strategy.root_device)

    def _on_device(self, tensors: list[Tensor]) -> list[Tensor]:
        """``tensors`` after the precision plugin's input conversion, on the module's device."""
        trainer = self.runtime.trainer
        return move_data_to_device(trainer.precision_plugin.convert_input(tensors), trainer.strategy.root_device)

    def _step(self, tied: bool, structure: type | TreeSpec, *, padded: bool) -> BatchedStep:
        key = (structure, padded)
        if key not in self._steps:
            self._steps[key] = batched_step(self.runtime.module, tied, structure, padded, self.compile_backend, self._norms)
        return self._steps[key]

    @cached_property
    def _norms(self) -> RealSampleNorms:
        """The module's BatchNorm layers in padded steps, which note one value per channel per sample."""
        return RealSampleNorms(self.runtime.module)

    def _run(self, step: BatchedStep, *args: Any) -> tuple[dict[str, Tensor], Tensor]:
        try:
            return step(*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as err:
            if isinstance(err, ValueError) and ONE_VALUE_PER_CHANNEL in str(err):
                raise  # a batch of one sample under BatchNorm: the client's data, not the module
            raise RuntimeError(
                f"{PREFIX} could not run {type(self.runtime.module).__name__}.training_step under torch.func "
                f"(functional_call + vmap): {type(err).__name__}: {err}. training_step must be a pure function of "
                "the weights and the batch (no .item(), data-dependent Python branches, or a log call other than "
                "self.log/self.log_dict); "
                "use client_executor='lightning' or 'lean' for this module."
            ) from err

    def _check_mean_step(self, leaves: list[Tensor], structure: type | TreeSpec, terms: TermInputs) -> None:
        """:func:`check_mean_step` once per executor, on the first padded step's first batch, with the first client's
        terms bound (so that a term drawn per step, FedMRN's, is read, not drawn again from a client's generator)."""
        if not self._mean_checked:
            first = {m: {n: t[0] for n, t in ts.items()} for m, ts in terms[0].items()}
            with bound(self.runtime.module, self.runtime.live, first, terms[1]):
                check_mean_step(self.runtime.module, self._on_device(leaves), structure)
            self._mean_checked = True

    @contextmanager
    def _measuring_forward(self) -> Iterator[ForwardBytes | None]:
        """Around the fit's first eager step when the group size is the default: the forward outputs of one client
        (under ``vmap``, each output has one client's shape); ``None`` otherwise."""
        if self._forward_bytes is not None or self.max_clients is not None or self.compile_backend:
            yield None
            return
        with ForwardBytes() as measured:
            yield measured

    @contextmanager
    def _noting_random_calls(self) -> Iterator[None]:
        """Around the executor's first eager step: names what ``training_step`` draws at random outside its dropout
        modules (named when the fit starts), once (:func:`~fl_lightning.loops.batched_exactness.warn_random_calls`),
        noted while that step runs (no extra call, so no side effect of the user's code is repeated). A compiled step is
        not traced by a mode."""
        if self._randomness_checked or self.compile_backend:
            yield
            return
        self._randomness_checked = True
        with RandomCalls(skipped=self._dropout) as calls:
            yield
        warn_random_calls(self.runtime.module, sorted(calls.names))

    def _warn_skipped_logging(self, names: set[str]) -> None:
        """Says once which metrics ``training_step`` logs that this executor skips."""
        if names and not self._logging_warned:
            rank_zero_warn(
                f"{PREFIX} skips the self.log calls of {type(self.runtime.module).__name__}.training_step "
                f"({', '.join(sorted(names))}): it runs the steps of several clients at once, so a ModelCheckpoint "
                "or EarlyStopping cannot monitor them. Each client's mean loss is still reported (round/train_loss); "
                "use client_executor='lightning' to log every step ('lean' keeps the on_epoch ones)."
            )
            self._logging_warned = True

    def _warn_nested(self) -> None:
        """Says once that the algorithm trains a client again from its ``client_update``, one client at a time."""
        if not self._nested_warned:
            rank_zero_warn(
                f"{PREFIX}: {type(self.runtime.algorithm).__name__}.client_update trains its client again with "
                "services.train_client, whose update it reads, so each such run trains as a group of one client: equal to "
                "the other executors, but not vectorised over clients (Ditto's personal pass ran so at 0.44-0.61x lean's "
                "clients/s, benchmarks/results/batched.md). A run whose update is not read can use "
                "services.train_client_later, which this executor trains with the group's other such runs, as one group."
            )
            self._nested_warned = True

    def _warn_step_count_read(self, read: bool) -> None:
        """Says once that ``training_step`` reads ``self.global_step``, which cannot advance per client here."""
        if read and not self._step_count_warned:
            rank_zero_warn(
                f"{PREFIX} trains a group of clients together, so trainer.global_step cannot advance within each "
                f"client as Lightning's loop advances it: {type(self.runtime.module).__name__}.training_step reads "
                "self.global_step, which stays at the group's start for all of its steps, so the weights differ from the "
                "Lightning executor's. Use client_executor='lightning', 'lean' or 'auto', which advance it per optimizer step."
            )
            self._step_count_warned = True
