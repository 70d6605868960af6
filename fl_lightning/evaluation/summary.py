"""Summaries of a per-client metric over the clients: the numbers federated evaluation logs.

Pure NumPy, no Lightning: every statistic is over the evaluated clients, each client counting
once, except the weighted mean, which weights client ``i`` by its held-out size ``n_i``.

Rules (``docs/federated_evaluation.md``):

* ``std`` is the population standard deviation (``ddof=0``).
* ``p10``/``p50``/``p90`` are ``np.percentile(values, q)`` with NumPy's default ``"linear"``
  interpolation (Hyndman & Fan type 7): the value at rank ``(m - 1) q / 100`` of the sorted
  values, interpolated linearly between the two neighbouring clients.
* ``worst10`` is the mean of the ``k = ceil(m / 10)`` worst clients (at least one): the lowest
  accuracies, or the highest losses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fl_lightning.evaluation.results import ClientEvaluation

#: The percentiles logged as ``p{q}``.
PERCENTILES = (10, 50, 90)


def worst_count(num_clients: int) -> int:
    """``ceil(num_clients / 10)``, in integers (``ceil(0.1 * 30)`` is 4 in floating point)."""
    if num_clients < 1:
        raise ValueError(f"worst-10% needs at least one client, got {num_clients}.")
    return (num_clients + 9) // 10


def worst10_mean(values: Sequence[float] | np.ndarray, *, highest: bool) -> float:
    """Mean of the ``ceil(m / 10)`` worst values: the highest if ``highest`` (losses), else the lowest."""
    ordered = np.sort(_as_array(values))
    k = worst_count(len(ordered))
    return float(ordered[-k:].mean() if highest else ordered[:k].mean())


def weighted_mean(values: Sequence[float] | np.ndarray, weights: Sequence[float] | np.ndarray) -> float:
    """``sum(w_i x_i) / sum(w_i)``."""
    x, w = _as_array(values), np.asarray(weights, dtype=np.float64)
    if w.shape != x.shape:
        raise ValueError(f"Got {len(w)} weights for {len(x)} values.")
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"Weights must be >= 0 with a positive sum, got {w.tolist()}.")
    return float(np.dot(w, x) / w.sum())


def accuracy_summary(accuracy: Sequence[float] | np.ndarray, num_samples: Sequence[float] | np.ndarray) -> dict[str, float]:
    """``acc_weighted_mean``, ``acc_mean``, ``acc_std``, ``acc_min``, ``acc_p10/p50/p90``, ``acc_worst10``."""
    acc = _as_array(accuracy)
    return {
        "acc_weighted_mean": weighted_mean(acc, num_samples),
        "acc_mean": float(acc.mean()),
        "acc_std": float(acc.std()),
        "acc_min": float(acc.min()),
        **{f"acc_p{q}": float(np.percentile(acc, q)) for q in PERCENTILES},
        "acc_worst10": worst10_mean(acc, highest=False),
    }


def loss_summary(loss: Sequence[float] | np.ndarray, num_samples: Sequence[float] | np.ndarray) -> dict[str, float]:
    """``loss_weighted_mean``, ``loss_mean``, ``loss_max``, ``loss_worst10`` (the highest losses)."""
    x = _as_array(loss)
    return {
        "loss_weighted_mean": weighted_mean(x, num_samples),
        "loss_mean": float(x.mean()),
        "loss_max": float(x.max()),
        "loss_worst10": worst10_mean(x, highest=True),
    }


def _as_array(values: Sequence[float] | np.ndarray) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or not len(x):
        raise ValueError(f"Expected a non-empty 1-D sequence of per-client values, got shape {x.shape}.")
    return x


def summarize(results: Sequence[ClientEvaluation]) -> dict[str, float]:
    """The distribution over ``results``: ``count``, :func:`accuracy_summary` (when accuracies
    are reported), :func:`loss_summary`, and the same under ``personal/`` over the clients that
    have their own model. Empty for no results."""
    metrics: dict[str, float] = {}
    for prefix, rows in (("", results), ("personal/", [r for r in results if r.personal_loss is not None])):
        if not rows:
            continue
        personal = bool(prefix)
        n = [r.num_samples for r in rows]
        metrics[f"{prefix}count"] = float(len(rows))
        accuracy = [r.personal_accuracy if personal else r.accuracy for r in rows]
        if all(a is not None for a in accuracy):
            metrics.update({f"{prefix}{k}": v for k, v in accuracy_summary(accuracy, n).items()})  # type: ignore[arg-type]
        loss = [r.personal_loss if personal else r.loss for r in rows]
        metrics.update({f"{prefix}{k}": v for k, v in loss_summary(loss, n).items()})  # type: ignore[arg-type]
    return metrics


def grouped_summary(
    results: Sequence[ClientEvaluation], groups: Mapping[str, Sequence[int]], *, prefix: str = "clients"
) -> dict[str, float]:
    """:func:`summarize` of all ``results`` under ``{prefix}/`` and of each group's under
    ``{prefix}/{group}/`` (a group none of whose clients was evaluated is left out)."""
    metrics = {f"{prefix}/{k}": v for k, v in summarize(results).items()}
    for name, members in groups.items():
        chosen = set(members)
        part = summarize([r for r in results if r.client_id in chosen])
        metrics.update({f"{prefix}/{name}/{k}": v for k, v in part.items()})
    return metrics
