"""BatchNorm over each client's real samples in the batched executor's padded steps.

A padded step runs ``training_step`` on each sample alone (an inner ``vmap`` over the samples,
:func:`~fl_lightning.loops.batched_sgd.batched_step`), so a BatchNorm layer in training mode would see one sample's
statistics, and over the whole padded batch the padding's copies would enter them. While a step runs,
:class:`RealSampleNorms` gives the module's training-mode BatchNorm layers :func:`masked_batch_norm` as their forward:
the statistics are reduced across the inner ``vmap``'s samples, over the client's real ones only
(:class:`_RealSampleMoments`, an ``autograd.Function`` whose ``vmap`` rule sees the whole batch), and every row is
normalised with them. Each real sample's output, the gradients through the statistics and the buffers' updates are
then those of ``torch.nn.BatchNorm1d/2d/3d`` in training mode on the client's unpadded batch.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm


class _RealSampleMoments(torch.autograd.Function):
    """Per channel: the mean and biased variance of a layer's input over the real samples, and their number of
    values (real samples x positions), all shared by the samples. Only under ``vmap`` over the samples, whose rule
    reduces across them; its operations are differentiated as they run (nothing is saved for a backward)."""

    @staticmethod
    def forward(x: Tensor, real: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        raise RuntimeError("_RealSampleMoments needs the samples of a padded batch as a vmap dimension.")

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: tuple[Tensor, Tensor, Tensor]) -> None:
        """Nothing to save (required of an ``autograd.Function`` under ``torch.func``)."""

    @staticmethod
    def vmap(info: Any, in_dims: tuple[int, int], x: Tensor, real: Tensor) -> tuple[tuple[Tensor, ...], tuple[None, ...]]:
        x = x.movedim(in_dims[0], 0)  # [samples, *one sample's input (N, C, *positions)]
        weight = real.movedim(in_dims[1], 0).to(x.dtype).reshape(-1, *(1,) * (x.dim() - 1))
        dims = [d for d in range(x.dim()) if d != 2]  # all but the channels
        count = weight.sum() * (x[0].numel() // x.shape[2])
        mean = (x * weight).sum(dims) / count
        centred = x - mean.reshape(-1, *(1,) * (x.dim() - 3))
        var = (centred * centred * weight).sum(dims) / count
        return (mean, var, count), (None, None, None)


def masked_batch_norm(layer: _BatchNorm, x: Tensor, real: Tensor) -> Tensor:
    r"""``layer``'s training-mode forward on one sample ``x`` (``[1, C, *positions]``) of a padded batch under the
    inner ``vmap``, ``real`` (0-dim) whether it is a real sample: torch's ``_BatchNorm.forward`` with the statistics of
    the real samples (``torch.nn.functional.batch_norm``, ``training=True``):

    .. math::
        y = \frac{x - \mu}{\sqrt{\sigma^2_{\text{biased}} + \epsilon}}\,\gamma + \beta, \qquad
        \hat\mu \leftarrow (1 - m)\,\hat\mu + m\,\mu, \qquad
        \hat\sigma^2 \leftarrow (1 - m)\,\hat\sigma^2 + m\,\sigma^2_{\text{biased}}\,\tfrac{n}{n - 1}

    over the :math:`n` values per channel of the real samples; ``num_batches_tracked`` counts the step, and
    ``momentum=None`` takes :math:`m = 1 / \text{num\_batches\_tracked}` (a cumulative average). A bfloat16/float16
    input is normalised in float32, as torch's kernels accumulate, and the output cast back.
    """
    dtype = x.dtype
    x = x.to(torch.promote_types(dtype, torch.float32))
    mean, var, count = _RealSampleMoments.apply(x, real)
    if layer.track_running_stats:
        with torch.no_grad():
            layer.num_batches_tracked.add_(1)
            momentum = layer.momentum
            factor = 1 / layer.num_batches_tracked.to(mean.dtype) if momentum is None else momentum
            unbiased = var * count / (count - 1)
            layer.running_mean.copy_(factor * mean + (1 - factor) * layer.running_mean)
            layer.running_var.copy_(factor * unbiased + (1 - factor) * layer.running_var)
    shape = (1, -1, *(1,) * (x.dim() - 2))
    scale = 1 / torch.sqrt(var + layer.eps)  # torch's CPU kernel: x * (invstd * weight) + (bias - mean * invstd * weight)
    if layer.weight is not None:
        scale = scale * layer.weight
    shift = -mean * scale if layer.bias is None else layer.bias - mean * scale
    return (x * scale.reshape(shape) + shift.reshape(shape)).to(dtype)


class RealSampleNorms:
    """The module's BatchNorm layers, made to normalise over a padded batch's real samples by :meth:`over`."""

    def __init__(self, module: nn.Module) -> None:
        self.layers = [m for m in module.modules() if isinstance(m, _BatchNorm)]
        #: Whether a layer got one value per channel from a sample: torch refuses a batch of one such sample in
        #: training (``Expected more than 1 value per channel``), which the executor then raises for the client.
        self.one_value_per_sample = False

    @contextmanager
    def over(self, real: Tensor) -> Iterator[None]:
        """Within the block, under the inner ``vmap`` over the samples: the training-mode layers run
        :func:`masked_batch_norm` with ``real``, the current sample's mask."""
        training = [m for m in self.layers if m.training]
        for layer in training:
            layer.forward = functools.partial(self._forward, layer, real=real)
        try:
            yield
        finally:
            for layer in training:
                del layer.forward

    def _forward(self, layer: _BatchNorm, x: Tensor, *, real: Tensor) -> Tensor:
        layer._check_input_dim(x)
        if x.numel() == x.shape[1]:
            self.one_value_per_sample = True
        return masked_batch_norm(layer, x, real)
