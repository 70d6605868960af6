"""Synthetic(alpha, beta), the heterogeneous benchmark of FedProx."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from fl_lightning.data._data_checks import check_choice, check_int
from fl_lightning.data.datasets.in_memory import InMemoryDataset
from fl_lightning.data.partitioners import _proportional_sizes as proportional_sizes
from fl_lightning.utils.checks import non_negative, positive

# Share of each device's samples in the train split, as in the reference generator.
_TRAIN_FRACTION = 0.9
#: Stream of the Pareto size weights, apart from the generator of the devices' data.
_PARETO_STREAM = 1


def generate_synthetic(
    *,
    alpha: float,
    beta: float,
    sizes: np.ndarray,
    num_classes: int,
    dim: int,
    iid: bool,
    rng: np.random.Generator,
) -> list[tuple[np.ndarray, np.ndarray]]:
    r"""Draws each device's samples of Synthetic(alpha, beta) (Li et al. 2020, arXiv 1812.06127, Sec. 5.1).

    For device :math:`k`, :math:`y = \arg\max(\mathrm{softmax}(W_k x + b_k))` with

    .. math::
        u_k \sim \mathcal{N}(0, \alpha^2),\quad W_k, b_k \sim \mathcal{N}(u_k, 1)\ \text{elementwise},

        B_k \sim \mathcal{N}(0, \beta^2),\quad v_k \sim \mathcal{N}(B_k, 1)\ \text{elementwise},
        \quad x \sim \mathcal{N}(v_k, \Sigma),\quad \Sigma_{jj} = j^{-1.2}.

    ``alpha`` and ``beta`` are standard deviations, as in the reference code's
    ``np.random.normal(0, alpha)``. With ``iid=True`` (Synthetic-IID) all devices share one
    :math:`W, b \sim \mathcal{N}(0, 1)` and :math:`x \sim \mathcal{N}(0, \Sigma)`; alpha and
    beta are ignored.

    Args:
        alpha: How much the devices' models differ.
        beta: How much the devices' feature distributions differ.
        sizes: Samples per device.
        num_classes: Number of classes.
        dim: Feature dimension.
        iid: Generate Synthetic-IID instead.
        rng: The only source of randomness.

    Returns:
        ``(x, y)`` per device: float64 ``[n_k, dim]`` features and int64 ``[n_k]`` labels.
    """
    num_devices = len(sizes)
    std_x = np.arange(1, dim + 1, dtype=np.float64) ** -0.6  # sqrt of Sigma_jj = j^-1.2
    u = rng.normal(0.0, alpha, num_devices)
    big_b = rng.normal(0.0, beta, num_devices)
    if iid:
        shared = (rng.normal(0.0, 1.0, (num_classes, dim)), rng.normal(0.0, 1.0, num_classes))
    devices = []
    for k, n in enumerate(sizes):
        if iid:
            v = np.zeros(dim)
            w, b = shared
        else:
            v = rng.normal(big_b[k], 1.0, dim)
            w = rng.normal(u[k], 1.0, (num_classes, dim))
            b = rng.normal(u[k], 1.0, num_classes)
        x = v + std_x * rng.standard_normal((int(n), dim))
        # softmax is monotone, so the argmax of the logits is the argmax of the probabilities.
        y = np.argmax(x @ w.T + b, axis=1).astype(np.int64)
        devices.append((x, y))
    return devices


class FedProxSynthetic(InMemoryDataset):
    r"""Synthetic(alpha, beta) of FedProx (Li et al. 2020), one split of it.

    Device sizes follow the reference generator, ``int(lognormal(4, 2)) + 50``, or, with
    ``sizes="pareto"``, a Type-I Pareto law (Ruan et al. 2021, §6: "the number of samples at each
    device follows the Type-I Pareto distribution with the Pareto index of 0.5"): weights
    :math:`x_k \sim \mathrm{Pareto}(a, x_m = 1)` split ``total_samples`` in proportion, every
    device keeping at least ``min_samples_per_client`` (our choice: the paper gives no floor). The paper gives no total; its index 0.5 has an infinite
    mean, so the sizes are normalised to a fixed pool. The first 90% of
    each device's samples form the train split, the rest the test split. Everything is drawn
    from ``np.random.default_rng(seed)``, so the train and test splits built separately with the
    same arguments come from the same devices. See :func:`generate_synthetic` for the model.

    Note that the shift :math:`u_k`, common to every entry of :math:`W_k` and :math:`b_k`, adds
    the same amount to every logit, so ``alpha`` does not change the data at all (for a fixed
    seed the samples are identical); label skew across devices comes from ``beta`` and from the
    per-device noise in :math:`W_k`. This follows the paper and its reference code.

    Args:
        alpha: Model heterogeneity, ``>= 0``.
        beta: Feature heterogeneity, ``>= 0``.
        num_clients: Number of devices.
        num_classes: Number of classes.
        dim: Feature dimension.
        split: ``"train"`` or ``"test"``.
        seed: Seed of the whole dataset.
        iid: Generate Synthetic-IID.
        samples_per_client: Override the lognormal sizes: one size for all devices, or one per
            device. Each must be ``>= 2`` so that both splits are non-empty.
        max_samples_per_client: Cap on the lognormal sizes, whose tail is very long.
        sizes: ``"lognormal"`` (the FedProx generator's) or ``"pareto"``.
        pareto_index: The Pareto shape :math:`a` for ``sizes="pareto"`` (> 0).
        total_samples: Samples of all devices together for ``sizes="pareto"``.
        min_samples_per_client: The floor of the Pareto sizes (>= 2, so that both splits are
            non-empty; ``total_samples`` must cover it for every device). With index 0.5 most
            devices sit at the floor, so it decides how many samples they have.

    Attributes:
        client_ids: The device of each sample, for :class:`~fl_lightning.data.Natural`.
    """

    def __init__(
        self,
        *,
        alpha: float = 1.0,
        beta: float = 1.0,
        num_clients: int = 30,
        num_classes: int = 10,
        dim: int = 60,
        split: Literal["train", "test"] = "train",
        seed: int = 0,
        iid: bool = False,
        samples_per_client: int | Sequence[int] | None = None,
        max_samples_per_client: int | None = None,
        sizes: Literal["lognormal", "pareto"] = "lognormal",
        pareto_index: float = 0.5,
        total_samples: int = 10_000,
        min_samples_per_client: int = 2,
    ) -> None:
        non_negative("alpha", alpha)
        non_negative("beta", beta)
        check_int("seed", seed, minimum=0)
        num_clients = check_int("num_clients", num_clients, minimum=1)
        num_classes = check_int("num_classes", num_classes, minimum=2)
        dim = check_int("dim", dim, minimum=1)
        check_choice("split", split, ("train", "test"))
        check_choice("sizes", sizes, ("lognormal", "pareto"))
        rng = np.random.default_rng(seed)
        # Drawn even when overridden so that the override changes only the sizes.
        counts = rng.lognormal(4.0, 2.0, num_clients).astype(np.int64) + 50
        if sizes == "pareto":
            counts = _pareto_sizes(num_clients, pareto_index, total_samples, seed, min_samples_per_client)
        if samples_per_client is not None:
            counts = _sizes_override(samples_per_client, num_clients)
        if max_samples_per_client is not None:
            cap = check_int("max_samples_per_client", max_samples_per_client, minimum=2)
            counts = np.minimum(counts, cap)
        devices = generate_synthetic(
            alpha=alpha, beta=beta, sizes=counts, num_classes=num_classes, dim=dim, iid=iid, rng=rng
        )
        xs, ys, ids = [], [], []
        for k, (x, y) in enumerate(devices):
            cut = int(_TRAIN_FRACTION * len(y))
            part = slice(None, cut) if split == "train" else slice(cut, None)
            xs.append(x[part])
            ys.append(y[part])
            ids.append(np.full(len(y[part]), k, dtype=np.int64))
        super().__init__(
            inputs=torch.from_numpy(np.concatenate(xs).astype(np.float32)),
            labels=torch.from_numpy(np.concatenate(ys)),
            num_classes=num_classes,
        )
        self.client_ids: np.ndarray = np.concatenate(ids)


def _sizes_override(samples_per_client: int | Sequence[int], num_clients: int) -> np.ndarray:
    if isinstance(samples_per_client, (int, np.integer)):
        return np.full(num_clients, check_int("samples_per_client", samples_per_client, minimum=2))
    if len(samples_per_client) != num_clients:
        raise ValueError(f"samples_per_client has {len(samples_per_client)} entries but num_clients={num_clients}.")
    return np.array([check_int("samples_per_client", n, minimum=2) for n in samples_per_client])


def _pareto_sizes(num_clients: int, index: float, total: int, seed: int, minimum: int) -> np.ndarray:
    """Device sizes ``>= minimum`` summing to ``total``, proportional to Pareto-I(``index``, 1) weights above the floor.

    The weights come from their own generator, so the devices' models and features do not
    depend on the size law.
    """
    positive("pareto_index", index)
    minimum = check_int("min_samples_per_client", minimum, minimum=2)
    total = check_int("total_samples", total, minimum=minimum * num_clients)
    # NumPy's ``pareto`` is the Lomax distribution; adding 1 gives Pareto-I with scale 1.
    weights = np.random.default_rng([seed, _PARETO_STREAM]).pareto(index, num_clients) + 1.0
    return proportional_sizes(total - (minimum - 1) * num_clients, weights) + (minimum - 1)
