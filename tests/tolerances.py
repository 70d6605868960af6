"""How far apart two computations of the same training may end when they differ only in rounding.

Two code paths that compute the same formula need not round alike: one may fuse a multiply and an add
(``add_(x, alpha=w)`` is one fused multiply-add on AVX2/AVX-512 CPUs, ``acc + w * x`` two roundings), a
vectorised kernel may reduce in another order on another CPU, or on memory aligned differently. Each such
difference is one unit in the last place (``eps``) of one operation, and every later optimizer step carries it
on, grown by the training's sensitivity. Measured: the CNN+BatchNorm oracle (lr 0.1) drifted 2.1e-5 in float32
after 15 sequential steps on an AVX-512 CPU, about 12 ``eps`` per step; :func:`cross_path_tolerance` allows 100.

Comparisons that claim more than "the same training up to rounding" run in float64, where this bound is
about 1e-13 per step, far below any difference a wrong formula, client or weight would make.
"""

from __future__ import annotations

import torch

#: Units in the last place that one sequential optimizer step may add to a cross-path difference.
ULPS_PER_STEP = 100


def cross_path_tolerance(dtype: torch.dtype, steps: int) -> float:
    """Max abs weight difference allowed between two paths of a training of ``steps`` sequential optimizer steps in ``dtype``."""
    if steps < 1:
        raise ValueError(f"`steps` must be >= 1, got {steps}.")
    return ULPS_PER_STEP * steps * torch.finfo(dtype).eps
