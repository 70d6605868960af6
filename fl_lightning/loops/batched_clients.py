"""The opt-in batched client executor: several clients' local SGD at once with ``torch.func``.

``FederatedTrainer(client_executor="batched")`` stacks the weights of ``K`` clients along a new
leading dimension and runs their local steps together: per step, one ``vmap`` over
``grad_and_value`` of the module's own ``training_step`` (called through ``functional_call``),
then a functional SGD update of the stacked weights. Each client's updates equal the
sequential executors' to float rounding (the same batches, in the same order; only the
batched matrix products round differently).

Clients whose batch-shape sequences are identical train together; unequal clients (another
number of steps, a smaller last batch) fall into other groups, each trained the same way, so
no padding or loss masking is involved. Extra memory: the stacked weights, gradients (and
momentum buffers) and activations of one group, about ``3 K`` models.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from fl_lightning import _lightning_compat as compat
from fl_lightning.algorithms.shared.base import Algorithm, ClientUpdate
from fl_lightning.callbacks.federated_callback import call_federated_hook
from fl_lightning.model_state import compute_delta, load_into

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from fl_lightning.loops.federated_fit_loop import FederatedFitLoop

__all__ = ["check_batched_support", "flatten_stream", "group_clients", "sgd_step", "signature", "train_clients_batched"]

#: ``torch.optim.SGD`` options the functional update reproduces exactly.
SGD_OPTIONS = ("lr", "momentum", "dampening", "nesterov", "weight_decay", "maximize")


def check_batched_support(loop: FederatedFitLoop) -> torch.optim.SGD:
    """Raises a ``ValueError`` naming what the batched executor cannot reproduce; returns the SGD optimizer."""
    trainer, module, algorithm = loop.trainer, loop.trainer.lightning_module, loop.algorithm
    prefix = "client_executor='batched'"
    if type(algorithm).configure_client is not Algorithm.configure_client:
        raise ValueError(
            f"{prefix} runs algorithms whose local work is plain SGD from the global weights "
            f"(configure_client not overridden, e.g. FedAvg, FedAvg with a server optimizer, CompressedFedAvg); "
            f"{type(algorithm).__name__} overrides configure_client. Use client_executor='lightning' or 'lean'."
        )
    if not loop.reset_optimizer:
        raise ValueError(f"{prefix} needs reset_optimizer=True (fresh optimizer state per client).")
    if not module.automatic_optimization or len(trainer.optimizers) != 1:
        raise ValueError(f"{prefix} needs automatic optimization with exactly one optimizer.")
    optimizer = trainer.optimizers[0]
    if type(optimizer) is not torch.optim.SGD:
        raise ValueError(
            f"{prefix} needs a torch.optim.SGD optimizer (options {', '.join(SGD_OPTIONS)}); got {type(optimizer).__name__}."
        )
    unsupported = {
        "gradient_clip_val": trainer.gradient_clip_val or None,
        "accumulate_grad_batches": trainer.accumulate_grad_batches if trainer.accumulate_grad_batches != 1 else None,
        "an interval='step' LR scheduler": next(
            (c.scheduler for c in trainer.lr_scheduler_configs if c.interval == "step"), None
        ),
        "gradient scaling": getattr(trainer.precision_plugin, "scaler", None),
        # Batches are moved to the device stacked (leading client dimension); a user's hook would see that.
        "overridden batch-transfer hooks": compat.overridden_batch_hooks(trainer) or None,
    }
    for what, value in unsupported.items():
        if value is not None:
            raise ValueError(f"{prefix} does not support {what} (got {value!r}); use client_executor='lightning'.")
    return optimizer


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
            raise TypeError(f"client_executor='batched' needs batches made of tensors only; got a batch of structure {spec}.")
        flat.append((leaves, spec))
    return flat


def _unflatten(leaves: list[Tensor], structure: type | TreeSpec) -> Any:
    return structure(leaves) if isinstance(structure, type) else tree_unflatten(leaves, structure)


def signature(stream: FlatStream) -> Hashable:
    """Structure, shapes and dtypes of every batch: clients with equal signatures can share a ``vmap``."""
    return tuple((spec, *((leaf.shape, leaf.dtype) for leaf in leaves)) for leaves, spec in stream)


def group_clients(signatures: Sequence[Hashable], max_clients: int | None = None) -> list[list[int]]:
    """Positions of equal signatures, grouped in order of first appearance, each group cut into
    chunks of at most ``max_clients``."""
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(signatures):
        groups.setdefault(key, []).append(i)
    size = max_clients or len(signatures) or 1
    return [members[i : i + size] for members in groups.values() for i in range(0, len(members), size)]


@torch.no_grad()
def sgd_step(
    params: dict[str, Tensor], grads: Mapping[str, Tensor], momenta: dict[str, Tensor], group: Mapping[str, Any]
) -> None:
    """One ``torch.optim.SGD`` step on (stacked) tensors, in place, with the same arithmetic as torch's."""
    lr, momentum, dampening = float(group["lr"]), group["momentum"], group["dampening"]
    for name, param in params.items():
        grad = grads[name] if not group["maximize"] else -grads[name]
        if group["weight_decay"]:
            grad = grad.add(param, alpha=group["weight_decay"])
        if momentum:
            buf = momenta.get(name)
            if buf is None:
                buf = momenta[name] = grad.clone()
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - dampening)
            grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
        param.add_(grad, alpha=-lr)


class _TrainingStep(nn.Module):
    """Lets ``functional_call`` run ``module.training_step`` instead of ``forward``."""

    def __init__(self, module: pl.LightningModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: Any, batch_idx: int) -> Tensor:
        step = self.module.training_step
        output = step(batch, batch_idx) if compat.step_takes_batch_idx(self.module) else step(batch)
        loss = output["loss"] if isinstance(output, Mapping) else output
        if not isinstance(loss, Tensor):
            raise TypeError(f"training_step must return a loss tensor (or a dict with 'loss'); got {type(loss).__name__}.")
        return loss


def _batched_step(module: pl.LightningModule, tied: bool) -> Callable[..., tuple[dict[str, Tensor], Tensor]]:
    """``(trained, others, batch, batch_idx) -> (grads, losses)`` over stacked weights and batches.

    ``tied``: the module has tied tensors (only the first name of each is passed).
    """
    wrapper = _TrainingStep(module)

    def loss(trained: dict[str, Tensor], others: dict[str, Tensor], batch: Any, batch_idx: int) -> Tensor:
        state = {f"module.{name}": tensor for name, tensor in (*trained.items(), *others.items())}
        return functional_call(wrapper, state, (batch, batch_idx), tie_weights=tied)

    # "different": each client draws its own random numbers (dropout masks), as if trained alone.
    return vmap(grad_and_value(loss), in_dims=(0, 0, 0, None), randomness="different")


class _StackedState:
    """``k`` copies of the module's tensors along a new leading dimension, split into the tensors the
    optimizer trains (by parameter group) and the rest (buffers, frozen parameters); tied tensors once."""

    def __init__(self, live: Mapping[str, Tensor], optimizer: torch.optim.SGD, k: int) -> None:
        first_name = {id(t): name for name, t in reversed(live.items())}
        #: Each ``state_dict`` name's stacked tensor (tied names share one).
        self.by_name: dict[str, Tensor] = {}
        for name, t in live.items():
            first = first_name[id(t)]
            if first not in self.by_name:
                self.by_name[first] = t.detach().unsqueeze(0).repeat(k, *(1,) * t.dim())
            self.by_name[name] = self.by_name[first]
        #: ``(param_group, {name: stacked parameter})`` per parameter group of the optimizer.
        self.groups = [
            (group, {first_name[id(p)]: self.by_name[first_name[id(p)]] for p in group["params"] if p.requires_grad})
            for group in optimizer.param_groups
        ]
        self.trained = {name: t for _, params in self.groups for name, t in params.items()}
        self.others = {name: self.by_name[name] for name in dict.fromkeys(first_name.values()) if name not in self.trained}

    def local_state(self, j: int) -> dict[str, Tensor]:
        """Client ``j``'s tensors by ``state_dict`` name."""
        return {name: t[j] for name, t in self.by_name.items()}


def _train_group(
    loop: FederatedFitLoop, optimizer: torch.optim.SGD, streams: Sequence[FlatStream]
) -> tuple[_StackedState, Tensor | None]:
    """Trains one group of equal-signature clients from the module's weights.

    Returns:
        The clients' stacked local state and each client's summed loss (``None`` without steps).
    """
    trainer, module = loop.trainer, loop.trainer.lightning_module
    state = _StackedState(loop._live, optimizer, len(streams))
    step = _batched_step(module, tied=len(state.trained) + len(state.others) < len(state.by_name))
    momenta: dict[str, Tensor] = {}
    loss_sum: Tensor | None = None
    device, precision = trainer.strategy.root_device, trainer.precision_plugin
    for batch_idx, batches in enumerate(zip(*streams)):
        stacked_leaves = [torch.stack(parts) for parts in zip(*(leaves for leaves, _ in batches))]
        batch = move_data_to_device(precision.convert_input(_unflatten(stacked_leaves, batches[0][1])), device)
        with precision.train_step_context():
            try:
                grads, losses = step(state.trained, state.others, batch, batch_idx)
            except torch.OutOfMemoryError:
                raise
            except Exception as err:
                raise RuntimeError(
                    f"client_executor='batched' could not run {type(module).__name__}.training_step under torch.func "
                    f"(functional_call + vmap): {type(err).__name__}: {err}. training_step must be a pure function of "
                    "the weights and the batch (no self.log, .item() or data-dependent Python branches); "
                    "use client_executor='lightning' or 'lean' for this module."
                ) from err
        for group, params in state.groups:
            sgd_step(params, grads, momenta, group)
        losses = losses.detach().float()
        loss_sum = losses if loss_sum is None else loss_sum + losses
    return state, loss_sum


def train_clients_batched(
    loop: FederatedFitLoop, round_idx: int, clients: Iterable[int], *, max_clients: int | None = None
) -> list[ClientUpdate]:
    """Trains the round's clients from the global weights, grouped by batch shapes; updates in the clients' order.

    Per group: ``on_client_start`` for each member, their local steps at once, then per
    member, with the module holding its local weights: ``algorithm.client_update`` and
    ``on_client_end``. ``max_clients`` caps a group's size (memory).
    """
    optimizer = check_batched_support(loop)
    trainer, module = loop.trainer, loop.trainer.lightning_module
    contexts = [loop.client_context(round_idx, cid) for cid in clients]
    streams = [flatten_stream(loop.client_batches(client)) for client in contexts]
    updates: list[ClientUpdate | None] = [None] * len(contexts)
    for members in group_clients([signature(stream) for stream in streams], max_clients):
        load_into(loop._live, loop.global_state)
        for i in members:
            call_federated_hook(trainer, "on_client_start", contexts[i])
        state, loss_sum = _train_group(loop, optimizer, [streams[i] for i in members])
        means = [] if loss_sum is None else (loss_sum / len(streams[members[0]])).tolist()
        for j, i in enumerate(members):
            client = contexts[i]
            client.completed_steps = len(streams[i])
            compat.count_steps(trainer, client.completed_steps)  # the step axis the other executors give
            if means:
                client.metrics["train_loss"] = means[j]
            load_into(loop._live, state.local_state(j))
            update = loop.algorithm.client_update(client, module, compute_delta(loop._live, loop.global_state))
            call_federated_hook(trainer, "on_client_end", client, update)
            updates[i] = update
    return [u for u in updates if u is not None]
