"""Pure functions of soft and hard clustered FL (FedSoft, IFCA): importance weights, aggregation
weights, per-cluster selection, averaging of full models and matching estimated clusters to
ground truth."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from fl_lightning.algorithms.shared.aggregation import weighted_average
from fl_lightning.server.model_state import State


def importance_weights(losses: Tensor, sigma: float) -> Tensor:
    r"""FedSoft's importance estimate for one client (Ruan & Joe-Wong 2022, Algorithm 1, lines 5-12).

    Every sample goes to the centre with the lowest loss (ties to the lowest index), and
    :math:`u_s = \max(n_s / n, \sigma)`. The result is *not* renormalised, so it may sum to
    slightly more than 1.

    Args:
        losses: ``[n, S]`` per-sample losses under each of the ``S`` centres.
        sigma: the floor :math:`\sigma > 0`.

    Returns:
        ``[S]`` float64 weights, on ``losses``' device.

    >>> importance_weights(torch.tensor([[0.1, 2.0], [0.3, 0.2], [0.0, 5.0], [1.0, 1.0]]), 1e-3)
    tensor([0.7500, 0.2500], dtype=torch.float64)
    >>> importance_weights(torch.tensor([[0.0, 1.0], [0.0, 1.0]]), 0.01)
    tensor([1.0000, 0.0100], dtype=torch.float64)
    """
    if losses.ndim != 2 or losses.shape[0] == 0 or losses.shape[1] == 0:
        raise ValueError(f"`losses` must have shape [n, S] with n, S >= 1, got {list(losses.shape)}.")
    counts = torch.bincount(losses.argmin(dim=1), minlength=losses.shape[1]).to(torch.float64)
    return (counts / losses.shape[0]).clamp_min(sigma)


def aggregation_weights(u: Tensor, num_samples: Tensor | Sequence[int]) -> Tensor:
    r"""FedSoft's :math:`v_{sk} = u_{ks} n_k / \sum_{j} u_{js} n_j` (eq. 6), normalised over **all**
    clients :math:`j \in [N]`.

    The paper prints the sum over the selected clients :math:`Sel_s^t`, which is circular (the
    selection is drawn from :math:`v`); its proof (eq. 38) and the authors' code use all clients.

    Args:
        u: ``[N, S]`` importance weights.
        num_samples: ``[N]`` client sizes :math:`n_k`.

    Returns:
        ``[N, S]`` float64, every column summing to 1.

    >>> aggregation_weights(torch.tensor([[0.9, 0.1], [0.1, 0.9]]), [100, 300])
    tensor([[0.7500, 0.0357],
            [0.2500, 0.9643]], dtype=torch.float64)
    """
    u = torch.as_tensor(u, dtype=torch.float64)
    n = torch.as_tensor(num_samples, dtype=torch.float64, device=u.device)
    if u.ndim != 2 or n.shape != (u.shape[0],):
        raise ValueError(f"`u` must be [N, S] and `num_samples` [N]; got {list(u.shape)} and {list(n.shape)}.")
    mass = u * n[:, None]
    total = mass.sum(dim=0)
    if (total <= 0).any():
        raise ValueError("Every cluster needs positive importance mass; is sigma > 0?")
    return mass / total


def select_per_cluster(v: Tensor, k: int, generator: torch.Generator, *, replace: bool = False) -> list[list[int]]:
    r""":math:`Sel_s`: for each cluster :math:`s` in turn, ``k`` clients drawn with probability
    :math:`\propto v_{sk}` from one generator (Algorithm 1, line 16).

    ``replace=False`` (default, as the authors' code: ``np.random.choice(..., replace=False)``)
    gives ``k`` distinct clients per cluster, drawn one by one proportionally to the remaining
    weights; ``replace=True`` gives ``k`` i.i.d. draws (the paper's analysis, eqs. 27 and 38), a
    client possibly repeated.

    Returns:
        ``S`` lists of client ids, in draw order (with repeats when ``replace``).
    """
    num_clients = v.shape[0]
    if not 1 <= k <= num_clients:
        raise ValueError(f"Cannot select k={k} clients per cluster out of {num_clients}: k must be in 1..{num_clients}.")
    return [
        torch.multinomial(v[:, s].to(torch.float64).cpu(), k, replacement=replace, generator=generator).tolist()
        for s in range(v.shape[1])
    ]


def average_states(states: Sequence[Mapping[str, Tensor]], weights: Sequence[float] | None = None) -> State:
    """Weighted average of full models (uniform by default); float tensors in at least float32,
    integer buffers (``num_batches_tracked``) rounded back to their own dtype.

    >>> average_states([{"w": torch.tensor([1.0]), "n": torch.tensor(2)}, {"w": torch.tensor([4.0]), "n": torch.tensor(5)}])
    {'w': tensor([2.5000]), 'n': tensor(4)}
    """
    weights = [1.0] * len(states) if weights is None else list(weights)
    return as_model(weighted_average(states, weights), states[0])


def as_model(state: Mapping[str, Tensor], like: Mapping[str, Tensor]) -> State:
    """``state`` with its integer buffers (``num_batches_tracked``) rounded back to their dtype in ``like``.

    >>> as_model({"w": torch.tensor([2.5]), "n": torch.tensor(3.5, dtype=torch.float64)}, {"w": torch.tensor([0.0]), "n": torch.tensor(0)})
    {'w': tensor([2.5000]), 'n': tensor(4)}
    """
    return {name: t if like[name].is_floating_point() else torch.round(t).to(like[name].dtype) for name, t in state.items()}


def match_clusters(u_hat: Tensor, u_true: Tensor) -> tuple[float, list[int]]:
    r"""Mean :math:`|\hat U - U|` after the best relabelling of the estimated clusters.

    Centre indices are arbitrary, so estimated cluster :math:`s` is matched to source
    :math:`\pi(s)` minimising :math:`\sum_{k,s} |\hat u_{ks} - u_{k\pi(s)}|` (all :math:`S!`
    permutations for :math:`S \le 8`, else the Hungarian algorithm on the same costs).

    Returns:
        ``(mean absolute error over the N x S entries, perm)`` with ``perm[s]`` the source of centre ``s``.

    >>> error, perm = match_clusters(torch.tensor([[0.1, 0.9], [0.8, 0.2]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    >>> round(error, 6), perm
    (0.15, [1, 0])
    """
    u_hat, u_true = torch.as_tensor(u_hat, dtype=torch.float64), torch.as_tensor(u_true, dtype=torch.float64)
    if u_hat.shape != u_true.shape or u_hat.ndim != 2:
        raise ValueError(f"`u_hat` and `u_true` must both be [N, S], got {list(u_hat.shape)} and {list(u_true.shape)}.")
    # cost[s, d]: total error when centre s stands for source d
    cost = (u_hat[:, :, None] - u_true[:, None, :]).abs().sum(dim=0)
    size = cost.shape[0]
    if size <= 8:
        perm = min(itertools.permutations(range(size)), key=lambda p: float(sum(cost[s, p[s]] for s in range(size))))
        perm_list = list(perm)
    else:
        from scipy.optimize import linear_sum_assignment

        rows, cols = linear_sum_assignment(cost.numpy())
        perm_list = [int(c) for _, c in sorted(zip(rows, cols))]
    total = float(sum(cost[s, perm_list[s]] for s in range(size)))
    return total / u_hat.numel(), perm_list
