"""The batched executor's arithmetic: stacked client weights, their vmapped gradients and ``torch.optim.SGD``'s update."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from torch.utils._pytree import TreeSpec, tree_unflatten

from fl_lightning import _lightning_compat as compat
from fl_lightning.loops.batched_attention import folded_attention
from fl_lightning.loops.batched_batch_norm import RealSampleNorms
from fl_lightning.loops.batched_terms import TermInputs, bound
from fl_lightning.mixins.regularized import split_losses

#: ``torch.optim.SGD`` options the functional update reproduces exactly.
SGD_OPTIONS = ("lr", "momentum", "dampening", "nesterov", "weight_decay", "maximize")


@torch.no_grad()
def sgd_step(
    params: Mapping[str, Tensor], grads: Mapping[str, Tensor], momenta: dict[str, Tensor], group: Mapping[str, Any], active: int
) -> None:
    """One ``torch.optim.SGD`` step of the first ``active`` stacked clients, in place, with torch's
    arithmetic (``grad += weight_decay * param``; ``buf = momentum * buf + (1 - dampening) * grad``;
    ``param -= lr * (grad + momentum * buf if nesterov else buf)``). The other clients' weights and
    momentum buffers are not touched. ``grads`` hold the active clients' gradients of the tensors that got
    one (a tensor without one is skipped, as torch skips a parameter whose ``grad`` is ``None``).

    One ``torch._foreach_*`` call per operation over the group's tensors (the kernels, hence the
    rounding, of the per-tensor ops, without a Python loop over the tensors)."""
    names = [name for name in params if name in grads]
    if not names:
        return
    weights = [params[name][:active] for name in names]
    update = [grads[name] for name in names]
    if group["maximize"]:
        update = torch._foreach_neg(update)
    if group["weight_decay"]:
        update = torch._foreach_add(update, weights, alpha=group["weight_decay"])
    momentum = group["momentum"]
    if momentum:
        if names[0] not in momenta:  # the first step: every client with a step is active
            bufs = [grad.clone() for grad in update]
            momenta.update(zip(names, bufs))
        else:
            bufs = [momenta[name][:active] for name in names]
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_add_(bufs, update, alpha=1 - group["dampening"])
        update = torch._foreach_add(update, bufs, alpha=momentum) if group["nesterov"] else bufs
    torch._foreach_add_(weights, update, alpha=-float(group["lr"]))


def unflatten(leaves: list[Tensor], structure: type | TreeSpec) -> Any:
    """The batch of ``leaves`` in ``structure`` (a ``tuple``/``list`` type, or a pytree spec)."""
    return structure(leaves) if isinstance(structure, type) else tree_unflatten(leaves, structure)


def step_loss(output: Any) -> Tensor:
    """The loss of a ``training_step`` output (a tensor, or a dict with ``"loss"``)."""
    loss = output["loss"] if isinstance(output, Mapping) else output
    if not isinstance(loss, Tensor):
        raise TypeError(
            f"training_step must return a loss tensor (or a dict with 'loss'); got {type(loss).__name__} (a step that "
            "returns None, which Lightning's loop skips, cannot be skipped for one client of a batched group)."
        )
    return loss


@contextmanager
def logging_skipped(module: pl.LightningModule) -> Iterator[set[str]]:
    """``module.log`` and ``module.log_dict`` as no-ops that collect the metric names.

    Under ``vmap`` a logged value holds every client's at once, which Lightning's logging cannot
    take; the batched executor skips these calls (the loop reports each client's mean loss).
    """
    names: set[str] = set()
    module.log = lambda name, *args, **kwargs: names.add(name)  # instance attributes shadow the methods
    module.log_dict = lambda metrics, *args, **kwargs: names.update(metrics)
    try:
        yield names
    finally:
        del module.log, module.log_dict


class _StepCountReads:
    """The trainer as the module sees it, noting whether ``global_step`` was read."""

    def __init__(self, trainer: pl.Trainer) -> None:
        self._trainer = trainer
        self.read = False

    @property
    def global_step(self) -> int:
        self.read = True
        return self._trainer.global_step

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)


@contextmanager
def step_count_reads(module: pl.LightningModule) -> Iterator[_StepCountReads]:
    """Notes whether ``module`` (or a LightningModule inside it) reads ``self.global_step``: stacked clients
    step together, so the count cannot advance within each client as Lightning's loop advances it."""
    trainer = module.trainer
    reads = _StepCountReads(trainer)
    module.trainer = reads  # type: ignore[assignment]  # the setter reaches nested LightningModules too
    try:
        yield reads
    finally:
        module.trainer = trainer


def call_training_step(module: pl.LightningModule, batch: Any, batch_idx: int) -> Tensor:
    step = module.training_step
    return step_loss(step(batch, batch_idx) if compat.step_takes_batch_idx(module) else step(batch))


class _TrainingStep(nn.Module):
    """Lets ``functional_call`` run ``module.training_step`` instead of ``forward``: returns the loss and its
    parts, ``(task loss, regularizer, 1 if there is one else 0)``
    (:func:`~fl_lightning.mixins.regularized.split_losses`)."""

    def __init__(self, module: pl.LightningModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: Any, batch_idx: int) -> tuple[Tensor, Tensor]:
        step = self.module.training_step
        output = step(batch, batch_idx) if compat.step_takes_batch_idx(self.module) else step(batch)
        loss = step_loss(output)
        task, regularizer = split_losses(output)
        parts = (task, torch.zeros_like(task), torch.zeros_like(task)) if regularizer is None else (
            task, regularizer.to(task), torch.ones_like(task)
        )
        return loss, torch.stack(parts).detach()


#: ``(trained, others, terms, leaves, batch_idx[, mask]) -> (grads, parts)`` over stacked clients: the gradients of
#: the tensors that got one, and each client's loss parts (:class:`_TrainingStep`).
BatchedStep = Callable[..., tuple[dict[str, Tensor], Tensor]]


def batched_step(
    module: pl.LightningModule,
    tied: bool,
    structure: type | TreeSpec,
    padded: bool,
    compile_backend: str | None = None,
    norms: RealSampleNorms | None = None,
) -> BatchedStep:
    """Every client's gradient and loss at one step, over stacked weights and batches.

    ``padded=False``: ``training_step`` on each client's whole batch. ``padded=True``: on each
    sample alone (an inner ``vmap``), the client's loss being ``sum(mask * losses) / sum(mask)``,
    the mean over its real samples, for a ``mask`` argument of the real samples; the BatchNorm layers in training mode
    normalise with the statistics of those real samples (``norms``, default the module's:
    :mod:`~fl_lightning.loops.batched_batch_norm`).
    ``tied``: the module has tied tensors (only the first name of each is passed).
    ``terms``: the group's loss terms (:mod:`~fl_lightning.loops.batched_terms`), bound to each client's weights
    and tensors while its ``training_step`` runs.
    ``compile_backend``: the step is ``vmap(grad_and_value(loss))`` under ``torch.compile`` with
    this backend, forward and backward in one graph, as issue 30's compiled hand-written loop;
    ``None``: eagerly, as below.

    The forward pass is vmapped; the backward pass is one ordinary autograd pass over the sum of
    the clients' losses (each client's weights only reach its own loss, so its gradient is its
    loss's), which is several times cheaper than ``vmap(grad(...))``'s per-op gradient tracking.
    Attention runs once over the clients folded into its batch
    (:func:`~fl_lightning.loops.batched_attention.folded_attention`), not once per client.
    """
    wrapper = _TrainingStep(module)
    norms = norms or RealSampleNorms(module)

    def loss(
        trained: dict[str, Tensor], others: dict[str, Tensor], terms: TermInputs, leaves: list[Tensor], batch_idx: int
    ) -> tuple[Tensor, Tensor]:
        state = {f"module.{name}": tensor for name, tensor in (*trained.items(), *others.items())}
        with bound(module, {**others, **trained}, *terms):
            return functional_call(wrapper, state, (unflatten(leaves, structure), batch_idx), tie_weights=tied)

    def masked_mean(
        trained: dict[str, Tensor], others: dict[str, Tensor], terms: TermInputs, leaves: list[Tensor], batch_idx: int,
        mask: Tensor,
    ) -> tuple[Tensor, Tensor]:
        def one(sample: list[Tensor], real: Tensor) -> tuple[Tensor, Tensor]:
            with norms.over(real):
                return loss(trained, others, terms, [t.unsqueeze(0) for t in sample], batch_idx)

        losses, parts = vmap(one, randomness="different")(leaves, mask)
        count = mask.sum().clamp(min=1)  # a client without a sample: 0
        return torch.where(mask, losses, 0).sum() / count, torch.where(mask.unsqueeze(1), parts, 0).sum(0) / count

    # "different": each client draws its own random numbers (dropout masks), as if trained alone.
    # Terms: (per-client tensors, shared tensors).
    in_dims = (0, 0, (0, None), 0, None, 0) if padded else (0, 0, (0, None), 0, None)
    client_loss = masked_mean if padded else loss
    if compile_backend is not None:
        compiled = torch.compile(
            vmap(grad_and_value(client_loss, has_aux=True), in_dims=in_dims, randomness="different"), backend=compile_backend
        )

        def compiled_step(*args: Any) -> tuple[dict[str, Tensor], Tensor]:
            grads, (_, parts) = compiled(*args)
            return grads, parts

        return compiled_step
    forward = vmap(client_loss, in_dims=in_dims, randomness="different")

    def step(trained: dict[str, Tensor], others: dict[str, Tensor], *args: Any) -> tuple[dict[str, Tensor], Tensor]:
        leaves = {name: t.detach().requires_grad_() for name, t in trained.items()}
        with torch.enable_grad(), folded_attention():
            losses, parts = forward(leaves, others, *args)
        grads = torch.autograd.grad(losses.sum(), list(leaves.values()), allow_unused=True)
        return {name: g for name, g in zip(leaves, grads) if g is not None}, parts

    return step


class StackedState:
    """``k`` copies of the module's tensors along a new leading dimension, split into the tensors the
    optimizer trains (by parameter group) and the rest (buffers, frozen parameters); tied tensors once."""

    def __init__(self, live: Mapping[str, Tensor], optimizer: torch.optim.SGD, k: int, aliases: Mapping[str, str]) -> None:
        first_name = {id(t): name for name, t in reversed(live.items())}
        #: Each ``state_dict`` name's stacked tensor (tied names, ``aliases`` of a name of ``live``, share one).
        self.by_name: dict[str, Tensor] = {}
        for name, t in live.items():
            first = first_name[id(t)]
            if first not in self.by_name:
                self.by_name[first] = t.detach().unsqueeze(0).repeat(k, *(1,) * t.dim())
            self.by_name[name] = self.by_name[first]
        for alias, name in aliases.items():
            if name in self.by_name:
                self.by_name[alias] = self.by_name[name]
        #: ``(param_group, {name: stacked parameter})`` per parameter group of the optimizer.
        self.groups = [
            (group, {first_name[id(p)]: self.by_name[first_name[id(p)]] for p in group["params"] if p.requires_grad})
            for group in optimizer.param_groups
        ]
        self.trained = {name: t for _, params in self.groups for name, t in params.items()}
        self.others = {name: self.by_name[name] for name in dict.fromkeys(first_name.values()) if name not in self.trained}
        self.tied = len(self.trained) + len(self.others) < len(self.by_name)

    def match_layout(self, grads: Mapping[str, Tensor]) -> None:
        """Stores each trained tensor in its gradient's memory layout where they differ.

        The one backward pass gives a vmapped linear layer's weight gradient transposed in memory
        (``[K, out, in]`` with strides of ``[K, in, out]``); adding it to a contiguous weight reads
        one of the two across the grain, which made the SGD update of pfl-research's CNN (a
        12,544 x 128 layer) 10x slower on a CPU (59 ms against 7.6 ms per step for 5 clients). The
        forward pass takes either layout at one cost; the values are the same.
        """
        for name, grad in grads.items():
            old = self.trained[name]
            if grad.stride()[1:] == old.stride()[1:] or grad.dim() < 2 or grad.stride(0) != old[0].numel():
                continue  # the same layout, or one with the client dimension inside (left alone)
            new = torch.empty_strided(old.shape, (old[0].numel(), *grad.stride()[1:]), dtype=old.dtype, device=old.device)
            new.copy_(old)
            self.by_name = {n: new if t is old else t for n, t in self.by_name.items()}
            self.trained[name] = new
            for _, params in self.groups:
                if name in params:
                    params[name] = new

    @torch.no_grad()
    def load_rows(self, rows: Sequence[Mapping[str, Tensor]]) -> None:
        """Puts ``rows[j]`` (tensors by ``state_dict`` name, a client's own local tensors) into client ``j``'s row."""
        for j, tensors in enumerate(rows):
            for name, t in tensors.items():
                self.by_name[name][j].copy_(t)

    def local_state(self, j: int) -> dict[str, Tensor]:
        """Client ``j``'s tensors by ``state_dict`` name."""
        return {name: t[j] for name, t in self.by_name.items()}
