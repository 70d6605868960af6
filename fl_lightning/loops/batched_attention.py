"""Scaled dot-product attention for stacked clients without ``vmap``'s per-client fallback.

``torch.nn.functional.scaled_dot_product_attention`` has no ``vmap`` batching rule for the CPU kernel it picks
(``aten::_scaled_dot_product_flash_attention_for_cpu``): under ``vmap`` torch warns "There is a performance drop
because we have not yet implemented the batching rule" and runs the kernel once per client. Attention has a
batch dimension of its own, so stacked clients need no rule of their own: :func:`folded_attention` folds the
client dimension into the batch (``[K, B, H, T, D] -> [K * B, H, T, D]``), runs the kernel once on the folded
tensors and unfolds its output. Each ``(sample, head)`` is computed as alone, so the result is the per-client
kernel's bit for bit, and autograd records the one native kernel, whose own backward runs.

Measured on a 2-core CPU, 1 thread, 32 clients of 8 x 32 tokens, 2 heads of 32 (2026-11-28): forward and backward
of the vmapped attention 198 ms with the fallback, 55 ms with the ``MATH`` backend (which differs by 1.5e-6), 41 ms
folded (difference 0); end to end, ``benchmarks/results/llm_lora.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._C._functorch import is_batchedtensor
from torch.func import vjp

from fl_lightning.mixins.applied_term import attribute_set

#: The unpatched kernel, called on folded (or unbatched) tensors.
_SDPA: Callable[..., Tensor] = F.scaled_dot_product_attention


def attention(
    query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
    is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
) -> Tensor:
    """``scaled_dot_product_attention``'s signature; tensors batched by ``vmap`` go through :class:`_FoldedAttention`."""
    tensors = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
    if not any(is_batchedtensor(t) for t in tensors):
        return _SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                     enable_gqa=enable_gqa)  # fmt: skip
    return _FoldedAttention.apply(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _fold(t: Tensor, dim: int | None, clients: int, batch: int) -> Tensor:
    """``t`` (a physical tensor, vmapped along ``dim``; logical rank <= 4, broadcast to 4) as ``[clients * batch, ...]``."""
    t = t.unsqueeze(0) if dim is None else t.movedim(dim, 0)
    t = t.reshape(t.shape[0], *(1,) * (5 - t.dim()), *t.shape[1:])
    t = t.expand(clients, batch, *t.shape[2:])
    return t.reshape(clients * batch, *t.shape[2:])


class _FoldedAttention(torch.autograd.Function):
    """SDPA whose ``vmap`` rule folds the vmapped dimension into the batch (module docstring)."""

    @staticmethod
    def forward(
        query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, dropout_p: float, is_causal: bool,
        scale: float | None, enable_gqa: bool,
    ) -> Tensor:
        return _SDPA(query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        ctx.save_for_backward(*inputs[:3])
        ctx.mask, ctx.options = inputs[3], inputs[4:]

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        # Only where a transform differentiates the Function itself (vmap over grad); under the executor's vmap the
        # folded kernel is what autograd records. Recomputes the forward (no dropout: its draw cannot be replayed).
        dropout_p, is_causal, scale, enable_gqa = ctx.options
        if dropout_p:
            raise RuntimeError("folded attention cannot differentiate attention dropout inside a transform; set dropout_p=0.")
        mask = ctx.mask

        def forward(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return _SDPA(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)

        _, pull = vjp(forward, *ctx.saved_tensors)
        return (*pull(grad), None, None, None, None, None)

    @staticmethod
    def vmap(
        info: Any, in_dims: tuple[int | None, ...], query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None,
        dropout_p: float, is_causal: bool, scale: float | None, enable_gqa: bool,
    ) -> tuple[Tensor, int]:
        clients = info.batch_size
        ranks = [t.dim() - (d is not None) for t, d in zip((query, key, value, mask), in_dims) if t is not None]
        if max(ranks) > 4 or min(ranks[:3]) < 4:  # not [B, H, T, D] (extra batch dimensions): attention per client
            out = torch.stack([
                attention(*(t if d is None else t.select(d, i) for t, d in zip((query, key, value), in_dims[:3])),
                          mask if mask is None or in_dims[3] is None else mask.select(in_dims[3], i),
                          dropout_p, is_causal, scale, enable_gqa)
                for i in range(clients)
            ])  # fmt: skip
            return out, 0
        batch = max(t.shape[1 if d == 0 else 0] for t, d in zip((query, key, value), in_dims))
        folded = [_fold(t, d, clients, batch) for t, d in zip((query, key, value), in_dims[:3])]
        mask = None if mask is None else _fold(mask, in_dims[3], clients, batch)
        out = attention(*folded, mask, dropout_p, is_causal, scale, enable_gqa)  # batched again under an outer vmap
        return out.reshape(clients, batch, *out.shape[1:]), 0


def folded_attention() -> AbstractContextManager[None]:
    """``torch.nn.functional.scaled_dot_product_attention`` as :func:`attention` inside the block (looked up at call
    time, as ``transformers``' ``attn_implementation="sdpa"`` does; a module that imported the function by name
    before keeps the original, and with it ``vmap``'s fallback)."""
    return attribute_set(F, "scaled_dot_product_attention", attention)
