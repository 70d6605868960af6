"""Clients whose data mix ``S`` source distributions (FedSoft, Ruan & Joe-Wong 2022, §5).

Each client ``k`` draws ``n_ks`` of its ``n_k`` samples from source ``s``; the proportions follow
one of the paper's patterns (:func:`mixture_proportions`). Every sample keeps its source in
``source_ids`` (ground truth for metrics and tests, never shown to an algorithm) and its client
in ``client_ids`` (use the :class:`~fl_lightning.data.Natural` partitioner). The ``test`` split
holds samples of every source with ``source_ids`` and no clients, for per-source evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from fl_lightning.data._data_checks import check_choice, check_int
from fl_lightning.utils.init_args import RecordsInitArgs
from fl_lightning.utils.checks import non_negative


def mixture_proportions(pattern: str, num_clients: int, num_sources: int, rng: np.random.Generator) -> np.ndarray:
    """``[N, S]`` mixture proportions of the paper's patterns (§5, "Data partitions").

    * ``"a:b"`` (``"10:90"``, ``"30:70"``, any ``a + b = 100``): the clients form ``S`` equal
      consecutive groups (the first ``N mod S`` one larger); group ``g`` draws ``b%`` from
      source ``g`` and ``a%`` split evenly over the other sources. For ``S = 2``, the first half
      is ``b:a`` and the second ``a:b``, as in the paper.
    * ``"linear"`` (``S = 2``): client ``k`` draws ``(k + 0.5)/N`` from source 0, the rest from
      source 1 (``(0.5 + k)%`` for ``N = 100``).
    * ``"random"``: each client's proportions are Dirichlet(1, ..., 1), i.e. ``[0, 1]`` cut at
      ``S - 1`` uniform points.

    >>> mixture_proportions("10:90", 4, 2, np.random.default_rng(0))
    array([[0.9, 0.1],
           [0.9, 0.1],
           [0.1, 0.9],
           [0.1, 0.9]])
    """
    num_clients = check_int("num_clients", num_clients, minimum=1)
    num_sources = check_int("num_sources", num_sources, minimum=1)
    if pattern == "random":
        return rng.dirichlet(np.ones(num_sources), size=num_clients)
    if pattern == "linear":
        if num_sources != 2:
            raise ValueError(f"The 'linear' pattern needs num_sources=2, got {num_sources}.")
        first = (np.arange(num_clients) + 0.5) / num_clients
        return np.stack([first, 1 - first], axis=1)
    parts = pattern.split(":")
    try:
        minor, major = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"`pattern` must be 'a:b' (e.g. '10:90'), 'linear' or 'random', got {pattern!r}.") from None
    if minor < 0 or major < 0 or not math.isclose(minor + major, 100):
        raise ValueError(f"A ratio pattern 'a:b' needs a, b >= 0 with a + b = 100, got {pattern!r}.")
    group = np.array_split(np.arange(num_clients), num_sources)
    props = np.full((num_clients, num_sources), minor / 100 / max(num_sources - 1, 1))
    for g, members in enumerate(group):
        props[members, g] = major / 100 if num_sources > 1 else 1.0
    return props


def mixture_counts(proportions: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``[N, S]`` sample counts: ``floor(p_ks * n_k)`` for every source but the last, which takes
    the rest (the authors' ``int(frac * n_k)`` for ``S = 2``)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    counts = np.floor(proportions[:, :-1] * sizes[:, None] + 1e-9).astype(np.int64)
    return np.concatenate([counts, (sizes - counts.sum(axis=1))[:, None]], axis=1)


def _client_sizes(samples_per_client: int | Sequence[int], num_clients: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(samples_per_client, (int, np.integer)):
        return np.full(num_clients, check_int("samples_per_client", samples_per_client, minimum=1))
    if len(samples_per_client) != 2 or not 1 <= samples_per_client[0] <= samples_per_client[1]:
        raise ValueError(f"samples_per_client must be an int or a range [low, high] with 1 <= low <= high, got {samples_per_client!r}.")
    low, high = (int(v) for v in samples_per_client)
    return rng.integers(low, high + 1, num_clients)


class SourceMixture(RecordsInitArgs, Dataset[tuple[Tensor, Tensor]]):
    """Samples of several sources, with each sample's source and client.

    Attributes:
        tensors: ``(inputs, targets)``, so client batches are cut by indexing.
        source_ids: source of each sample (ground truth; ``int64`` NumPy array).
        client_ids: client of each sample (``-1`` in the test split).
        num_sources: ``S``.
        proportions: ``[N, S]`` designed mixture of each client (train split).
        counts: ``[N, S]`` samples of each source on each client (train split).
    """

    tensors: tuple[Tensor, Tensor]
    source_ids: np.ndarray
    client_ids: np.ndarray
    num_sources: int
    proportions: np.ndarray
    counts: np.ndarray

    def _store(self, inputs: Tensor, targets: Tensor, sources: np.ndarray, clients: np.ndarray) -> None:
        self.tensors = (inputs, targets)
        self.source_ids, self.client_ids = sources.astype(np.int64), clients.astype(np.int64)

    def _layout(
        self, pattern: str, num_clients: int, samples_per_client: int | Sequence[int], rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """Proportions, then counts, drawn from ``rng``; returns per-sample (source, client) ids."""
        self.proportions = mixture_proportions(pattern, num_clients, self.num_sources, rng)
        self.counts = mixture_counts(self.proportions, _client_sizes(samples_per_client, num_clients, rng))
        sources = np.concatenate([np.repeat(np.arange(self.num_sources), row) for row in self.counts])
        clients = np.repeat(np.arange(num_clients), self.counts.sum(axis=1))
        return sources, clients

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.tensors[0][index], self.tensors[1][index]

    def __len__(self) -> int:
        return len(self.tensors[1])


class SyntheticRegressionMixture(SourceMixture):
    r"""FedSoft's synthetic data: linear regression with one coefficient vector per source (§5).

    :math:`y = \langle x, \theta_s \rangle + \epsilon`, :math:`x \sim \mathcal N(0, I_d)`,
    :math:`\epsilon \sim \mathcal N(0, \text{noise\_std}^2)`, :math:`\theta_s \sim \mathcal N(0, \text{theta\_var}\, I_d)`.
    ``theta_var`` is a *variance*, 10 by default, as in the authors' code (the paper writes
    :math:`\sigma_0 = 10`; the reported errors match a variance of 10). Client sizes are uniform
    in ``samples_per_client`` (paper: 100..200) and each client's samples are fresh draws.

    ``split="test"`` gives ``test_samples_per_source`` samples of each source (paper's code:
    1000). Both splits built with the same ``seed`` share the :math:`\theta_s`; the training
    data does not depend on the test size.

    Attributes:
        thetas: ``[S, d]`` float32 true coefficients (the optimal centres).
    """

    def __init__(
        self,
        *,
        num_sources: int = 2,
        num_clients: int = 100,
        pattern: str = "10:90",
        dim: int = 10,
        theta_var: float = 10.0,
        noise_std: float = 1.0,
        samples_per_client: int | Sequence[int] = (100, 200),
        split: Literal["train", "test"] = "train",
        test_samples_per_source: int = 1000,
        seed: int = 0,
    ) -> None:
        self.num_sources = check_int("num_sources", num_sources, minimum=1)
        dim = check_int("dim", dim, minimum=1)
        check_choice("split", split, ("train", "test"))
        non_negative("theta_var", theta_var)
        non_negative("noise_std", noise_std)
        check_int("test_samples_per_source", test_samples_per_source, minimum=1)
        seed = check_int("seed", seed, minimum=0)
        self.thetas = torch.from_numpy(
            np.random.default_rng([seed, 0]).normal(0.0, math.sqrt(theta_var), (num_sources, dim)).astype(np.float32)
        )
        if split == "train":
            rng = np.random.default_rng([seed, 1])
            sources, clients = self._layout(pattern, num_clients, samples_per_client, rng)
        else:
            rng = np.random.default_rng([seed, 2])
            per_source = check_int("test_samples_per_source", test_samples_per_source, minimum=1)
            sources, clients = np.repeat(np.arange(num_sources), per_source), np.full(num_sources * per_source, -1)
        x = rng.standard_normal((len(sources), dim))
        y = np.einsum("nd,nd->n", x, self.thetas.numpy().astype(np.float64)[sources]) + noise_std * rng.standard_normal(len(sources))
        self._store(torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32))[:, None], sources, clients)


class RotatedMixture(SourceMixture):
    """Sources are an image dataset rotated by multiples of 90° (counter-clockwise), e.g. 0° and
    90° (FedSoft's CIFAR-10 experiment) or 0/90/180/270°.

    Training split: client ``k`` draws its ``n_ks`` source-``s`` samples class-balanced with
    replacement from ``base`` (a class uniformly, then an instance of it, as the authors' code)
    and rotates them by ``angles[s]``. Test split (``split="test"``; pass the base test set):
    every ``base`` sample under every angle. Labels are unchanged by rotation.

    Args:
        base: an in-memory image dataset (``tensors = (images [n, C, H, W], labels)``, square
            images), e.g. ``Digits(as_image=True)``, ``EMNIST``, ``CIFAR10``.
        angles: one angle per source, multiples of 90.
        num_clients, pattern, samples_per_client, seed: the mixture (see :func:`mixture_proportions`).
        split: ``"train"`` (clients) or ``"test"`` (every sample, every angle).

    Attributes:
        targets: labels as a NumPy array; num_classes: the base's.
    """

    def __init__(
        self,
        base: Dataset,
        *,
        angles: Sequence[int] = (0, 90),
        num_clients: int = 100,
        pattern: str = "10:90",
        samples_per_client: int | Sequence[int] = (100, 200),
        split: Literal["train", "test"] = "train",
        seed: int = 0,
    ) -> None:
        check_choice("split", split, ("train", "test"))
        tensors = getattr(base, "tensors", None)
        if tensors is None or tensors[0].ndim != 4 or tensors[0].shape[-1] != tensors[0].shape[-2]:
            raise ValueError("RotatedMixture needs an in-memory dataset of square images: `tensors = (images [n, C, H, H], labels)`.")
        if not angles or any(a % 90 for a in angles):
            raise ValueError(f"`angles` must be non-empty multiples of 90, got {list(angles)}.")
        images, labels = tensors[0], torch.as_tensor(tensors[1])
        self.num_sources, self.angles = len(angles), [int(a) for a in angles]
        self.num_classes = int(getattr(base, "num_classes", int(labels.max()) + 1))
        if split == "train":
            rng = np.random.default_rng([check_int("seed", seed, minimum=0), 3])
            sources, clients = self._layout(pattern, num_clients, samples_per_client, rng)
            index = _class_balanced(labels.numpy(), len(sources), rng)
        else:
            index = np.tile(np.arange(len(labels)), self.num_sources)
            sources, clients = np.repeat(np.arange(self.num_sources), len(labels)), np.full(len(index), -1)
        picked = images[torch.from_numpy(index)]
        for s, angle in enumerate(self.angles):
            mask = torch.from_numpy(sources == s)
            picked[mask] = torch.rot90(picked[mask], k=(angle // 90) % 4, dims=(-2, -1))
        targets = labels[torch.from_numpy(index)].to(torch.int64)
        self._store(picked.contiguous(), targets, sources, clients)
        self.targets = targets.numpy()


def _class_balanced(labels: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` indices: a class drawn uniformly, then one of its samples uniformly (with replacement)."""
    classes = np.unique(labels)
    by_class = [np.flatnonzero(labels == c) for c in classes]
    chosen = rng.integers(0, len(classes), count)
    return np.array([by_class[c][rng.integers(0, len(by_class[c]))] for c in chosen], dtype=np.int64)
