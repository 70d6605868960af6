"""``torch.optim.Adam`` and ``AdamW`` over stacked client weights: per-client moments, stacked like the weights."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

#: ``torch.optim.Adam``/``AdamW`` options the functional update reproduces (``foreach``, ``fused`` and ``capturable``
#: pick torch's kernel for the same formula, equal to float rounding; the update below is its single-tensor one).
ADAM_OPTIONS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "decoupled_weight_decay")


@torch.no_grad()
def adam_step(
    params: Mapping[str, Tensor], grads: Mapping[str, Tensor], moments: dict[str, dict[str, Tensor]], group: Mapping[str, Any],
    active: int, step: int,
) -> None:
    r"""Step ``step`` (1-based) of Adam (Kingma & Ba 2015, Algorithm 1) or AdamW (Loshchilov & Hutter 2019,
    Algorithm 2, ``decoupled_weight_decay``) for the first ``active`` stacked clients, in place, with the
    arithmetic of torch's ``_single_tensor_adam``:

    * ``g = -g`` if ``maximize``; AdamW: :math:`w \leftarrow w (1 - \eta\lambda)`, Adam: :math:`g \leftarrow g + \lambda w`;
    * :math:`m \leftarrow m + (1 - \beta_1)(g - m)` (``lerp``), :math:`v \leftarrow \beta_2 v + (1 - \beta_2) g^2`;
      with ``amsgrad``, :math:`\hat v \leftarrow \max(\hat v, v)` is used for :math:`v` below;
    * :math:`w \leftarrow w - \frac{\eta}{1 - \beta_1^t} \, m / (\sqrt{v} / \sqrt{1 - \beta_2^t} + \epsilon)`.

    Every client starts from a fresh optimizer and the clients still training at a step are a prefix of the stack,
    so they share the step count ``t``: the bias corrections are one number per step, computed in Python floats as
    torch computes them. The other clients' weights and moments are not touched. ``moments`` holds each trained
    tensor's ``exp_avg``, ``exp_avg_sq`` (and ``max_exp_avg_sq``), created at the first step; ``grads`` holds the
    active clients' gradients of the tensors that got one (a tensor without one is skipped, as torch skips a
    parameter whose ``grad`` is ``None``).
    """
    lr, (beta1, beta2), eps, decay = float(group["lr"]), group["betas"], group["eps"], group["weight_decay"]
    beta1, beta2 = float(beta1), float(beta2)
    bias_correction1 = 1 - beta1**step
    step_size = lr / bias_correction1
    bias_correction2_sqrt = (1 - beta2**step) ** 0.5
    for name, param in params.items():
        if name not in grads:
            continue
        weight, grad = param[:active], grads[name]
        if group["maximize"]:
            grad = -grad
        if name not in moments:  # the first step: every client with a step is active
            keys = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group["amsgrad"] else ("exp_avg", "exp_avg_sq")
            moments[name] = {key: torch.zeros_like(param) for key in keys}
        state = {key: t[:active] for key, t in moments[name].items()}
        if decay:
            if group.get("decoupled_weight_decay", False):
                weight.mul_(1 - lr * decay)
            else:
                grad = grad.add(weight, alpha=decay)
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        second = state["exp_avg_sq"]
        if group["amsgrad"]:
            torch.maximum(state["max_exp_avg_sq"], second, out=state["max_exp_avg_sq"])
            second = state["max_exp_avg_sq"]
        denom = (second.sqrt() / bias_correction2_sqrt).add_(eps)
        weight.addcdiv_(state["exp_avg"], denom, value=-step_size)
