"""Partitioners: how a centralised dataset is split among federated clients.

Every partitioner maps ``(targets, num_samples, num_clients, rng)`` to one sorted, disjoint,
non-empty ``int64`` index array per client, and is deterministic given the state of ``rng``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

import numpy as np
from typing_extensions import override

from fl_lightning.data._data_checks import check_int, check_partition
from fl_lightning.utils.init_args import RecordsInitArgs

Needs = Literal["targets", "client_ids", "none"]

# Dirichlet resampling is a rejection loop; past this many tries the setting is hopeless.
_MAX_DIRICHLET_TRIES = 1000


class Partitioner(RecordsInitArgs, ABC):
    """Splits the sample indices ``0..num_samples-1`` among ``num_clients`` clients.

    Subclasses implement :meth:`_partition`; ``__call__`` validates the inputs and the output, so
    every partitioner raises the same errors for the same mistakes.

    Attributes:
        needs: What the datamodule passes as ``targets``: the labels (``"targets"``), the
            dataset's per-sample ``client_ids`` (``"client_ids"``) or ``None`` (``"none"``).
    """

    needs: Needs = "targets"

    def __call__(
        self, targets: np.ndarray | None, num_samples: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Partitions the dataset.

        Args:
            targets: Per-sample labels or client ids (see :attr:`needs`), or ``None``.
            num_samples: Dataset size.
            num_clients: Number of clients.
            rng: The only source of randomness.

        Returns:
            One sorted ``int64`` index array per client; the arrays are disjoint and non-empty.
        """
        num_samples = check_int("num_samples", num_samples, minimum=1)
        num_clients = check_int("num_clients", num_clients, minimum=1)
        if num_clients > num_samples:
            raise ValueError(
                f"num_clients={num_clients} exceeds num_samples={num_samples}; every client needs at least one sample."
            )
        if self.needs != "none":
            if targets is None:
                raise ValueError(f"{self!r} needs {self.needs}, got None.")
            targets = np.asarray(targets)
            if targets.shape != (num_samples,):
                raise ValueError(f"{self!r}: {self.needs} must have shape ({num_samples},), got {targets.shape}.")
        parts = self._partition(targets, num_samples, num_clients, rng)
        return check_partition(parts, num_clients=num_clients, num_samples=num_samples, source=repr(self))

    @abstractmethod
    def _partition(
        self, targets: np.ndarray | None, num_samples: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Returns one index array per client; inputs are already validated."""

    def __repr__(self) -> str:
        args = ", ".join(f"{key}={value!r}" for key, value in self.init_args.items())
        return f"{type(self).__name__}({args})"


class IID(Partitioner):
    """Uniformly random split into sizes that differ by at most one."""

    needs: Needs = "none"

    @override
    def _partition(
        self, targets: np.ndarray | None, num_samples: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        return np.array_split(rng.permutation(num_samples), num_clients)


class Dirichlet(Partitioner):
    r"""Label skew: each class is spread over the clients in proportions drawn from :math:`\mathrm{Dir}(\alpha)`.

    The per-class scheme of Hsu et al. 2019 (arXiv 1909.06335) as implemented in FedLab's
    ``hetero_dir_partition`` and NIID-Bench, including their balancing rule: a client already
    holding ``num_samples / num_clients`` samples receives nothing from later classes. The whole
    draw is repeated until every client has ``min_samples`` samples.

    Args:
        alpha: Concentration; small values (0.1) give few labels per client, large ones (100)
            approach IID.
        min_samples: Minimum client size accepted by the resampling loop.
    """

    def __init__(self, *, alpha: float, min_samples: int = 1) -> None:
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha!r}.")
        self.alpha = float(alpha)
        self.min_samples = check_int("min_samples", min_samples, minimum=1)

    @override
    def _partition(
        self, targets: np.ndarray | None, num_samples: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        assert targets is not None
        if self.min_samples * num_clients > num_samples:
            raise ValueError(
                f"min_samples={self.min_samples} for {num_clients} clients needs "
                f"{self.min_samples * num_clients} samples, but there are {num_samples}."
            )
        by_class = [np.flatnonzero(targets == label) for label in np.unique(targets)]
        for _ in range(_MAX_DIRICHLET_TRIES):
            parts = self._draw(by_class, num_samples, num_clients, rng)
            if parts is not None and min(len(part) for part in parts) >= self.min_samples:
                return parts
        raise ValueError(
            f"{self!r} left a client with fewer than min_samples={self.min_samples} samples in "
            f"{_MAX_DIRICHLET_TRIES} draws; use fewer clients (num_clients={num_clients}), "
            "a larger alpha or a smaller min_samples."
        )

    def _draw(
        self, by_class: list[np.ndarray], num_samples: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray] | None:
        chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        for indices in by_class:
            indices = rng.permutation(indices)
            shares = rng.dirichlet(np.full(num_clients, self.alpha))
            shares = shares * (sizes < num_samples / num_clients)
            if shares.sum() <= 0:
                # All open clients drew (numerically) zero mass: reject the whole draw.
                return None
            cuts = (np.cumsum(shares / shares.sum()) * len(indices)).astype(np.int64)[:-1]
            for cid, chunk in enumerate(np.split(indices, cuts)):
                chunks[cid].append(chunk)
                sizes[cid] += len(chunk)
        return [np.concatenate(client) for client in chunks]


class Shards(Partitioner):
    """Pathological non-IID split of McMahan et al. 2017 (FedAvg, arXiv 1602.05629, Sec. 3).

    Sorts the samples by label, cuts them into ``num_clients * shards_per_client`` shards of
    equal size (up to one sample, so no sample is dropped) and deals each client
    ``shards_per_client`` random shards. Samples are shuffled before the stable sort, so a shard
    is a random subset of its label. A shard may straddle two labels when class sizes are not
    multiples of the shard size, as in the paper's MNIST setup.

    Args:
        shards_per_client: Shards per client (2 in the paper).
    """

    def __init__(self, shards_per_client: int = 2) -> None:
        self.shards_per_client = check_int("shards_per_client", shards_per_client, minimum=1)

    @override
    def _partition(
        self, targets: np.ndarray | None, num_samples: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        assert targets is not None
        num_shards = num_clients * self.shards_per_client
        if num_shards > num_samples:
            raise ValueError(
                f"Shards needs num_clients * shards_per_client = {num_clients} * "
                f"{self.shards_per_client} = {num_shards} shards but there are only {num_samples} "
                "samples; use fewer clients or fewer shards per client."
            )
        shuffled = rng.permutation(num_samples)
        by_label = shuffled[np.argsort(targets[shuffled], kind="stable")]
        shards = np.array_split(by_label, num_shards)
        owner = rng.permutation(num_shards).reshape(num_clients, self.shards_per_client)
        return [np.concatenate([shards[s] for s in row]) for row in owner]


class LabelsPerClient(Partitioner):
    """Each client holds exactly ``k`` distinct labels.

    ``assignment="shuffled"`` deals labels round-robin over a random permutation of the labels.
    ``assignment="balanced"`` is FedMRN's "Non-IID-2" (#labels per client, after NIID-Bench,
    Li et al. ICDE 2022): client ``i`` takes, in turn, the ``k`` labels held by the fewest
    clients so far (ties to the smaller label), the code's ``argsort(times / (i + 1))[:k]``, so
    the label assignment is deterministic and does not depend on the seed. Either way every label
    is used once ``num_clients * k >= num_labels`` and each label has the same number of holders
    up to one. Each label's samples are split evenly among its holders; labels that no client
    holds (when ``num_clients * k < num_labels``) are left out.

    Args:
        k: Labels per client.
        assignment: ``"shuffled"`` (default) or ``"balanced"``.
    """

    def __init__(self, k: int, assignment: Literal["shuffled", "balanced"] = "shuffled") -> None:
        self.k = check_int("k", k, minimum=1)
        if assignment not in ("shuffled", "balanced"):
            raise ValueError(f"`assignment` must be 'shuffled' or 'balanced', got {assignment!r}.")
        self.assignment = assignment

    @override
    def _partition(
        self, targets: np.ndarray | None, num_samples: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        assert targets is not None
        labels = np.unique(targets)
        if self.assignment == "balanced":
            client_labels = _balanced_labels(labels, num_clients, self.k)
        else:
            client_labels = _deal_labels(labels, num_clients, self.k, rng)
        return _split_labels(targets, client_labels, np.ones(num_clients), rng)


class ParetoSizes(Partitioner):
    """Client sizes follow a Pareto (power-law) distribution.

    Each client draws a weight from a Pareto distribution with scale 1 and the given shape; the
    dataset is split in proportion to the weights, every client getting at least one sample.
    With ``labels_per_client=k`` labels are dealt as in :class:`LabelsPerClient` and each label
    is split among its holders in proportion to their weights, which with ``k=1`` is the MNIST
    setup of Ruan et al. 2021 (flexible device participation, arXiv 2006.06954): one label per
    device, power-law sizes.

    Args:
        shape: Pareto shape (tail index). The default 1.16 (= log4(5)) is the "80/20" shape:
            20% of the clients hold 80% of the data.
        labels_per_client: If set, the number of labels per client.
    """

    def __init__(self, *, shape: float = 1.16, labels_per_client: int | None = None) -> None:
        if not shape > 0:
            raise ValueError(f"shape must be > 0, got {shape!r}.")
        self.shape = float(shape)
        self.labels_per_client = (
            None if labels_per_client is None else check_int("labels_per_client", labels_per_client, minimum=1)
        )
        self.needs = "none" if labels_per_client is None else "targets"

    @override
    def _partition(
        self, targets: np.ndarray | None, num_samples: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        # NumPy's ``pareto`` is the Lomax distribution; shifting by one gives Pareto with scale 1.
        weights = rng.pareto(self.shape, num_clients) + 1.0
        if self.labels_per_client is None:
            sizes = _proportional_sizes(num_samples, weights)
            return np.split(rng.permutation(num_samples), np.cumsum(sizes)[:-1])
        assert targets is not None
        client_labels = _deal_labels(np.unique(targets), num_clients, self.labels_per_client, rng)
        return _split_labels(targets, client_labels, weights, rng)


class Natural(Partitioner):
    """The dataset's own clients: sample ``i`` goes to the client with id ``client_ids[i]``.

    Client ``c`` is the ``c``-th smallest distinct id. Draws nothing from ``rng``.
    """

    needs: Needs = "client_ids"

    @override
    def _partition(
        self, targets: np.ndarray | None, num_samples: int, num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        assert targets is not None
        ids, order, offsets = group_rows(targets)
        if len(ids) != num_clients:
            raise ValueError(
                f"Natural: the dataset has {len(ids)} distinct client ids but num_clients={num_clients}; "
                f"set num_clients={len(ids)}."
            )
        return np.split(order, offsets[1:-1])


def group_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows grouped by value: the sorted distinct values ``ids``, and ``order`` with ``offsets`` such that
    ``order[offsets[c]:offsets[c + 1]]`` are the rows holding ``ids[c]``, in row order.

    One index of ``len(values)`` integers and one of ``len(ids) + 1``, not an array per group, so a
    population of 100,000+ users costs two arrays.
    """
    ids, group_of = np.unique(values, return_inverse=True)
    order = np.argsort(group_of.reshape(-1), kind="stable")
    offsets = np.concatenate([[0], np.cumsum(np.bincount(group_of.reshape(-1), minlength=len(ids)))])
    return ids, order, offsets


def _deal_labels(labels: np.ndarray, num_clients: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Gives client ``c`` the labels at positions ``c*k .. c*k+k-1`` (cyclically) of a shuffled label list."""
    if k > len(labels):
        raise ValueError(f"{k} labels per client requested but the dataset has only {len(labels)} labels.")
    shuffled = rng.permutation(labels)
    return [shuffled[(cid * k + np.arange(k)) % len(labels)] for cid in range(num_clients)]


def _balanced_labels(labels: np.ndarray, num_clients: int, k: int) -> list[np.ndarray]:
    """Client by client, the ``k`` labels with the fewest holders so far (ties: the smaller label)."""
    if k > len(labels):
        raise ValueError(f"{k} labels per client requested but the dataset has only {len(labels)} labels.")
    holders = np.zeros(len(labels), dtype=np.int64)
    assigned = []
    for _ in range(num_clients):
        chosen = np.sort(np.argsort(holders, kind="stable")[:k])
        holders[chosen] += 1
        assigned.append(labels[chosen])
    return assigned


def _split_labels(
    targets: np.ndarray, client_labels: list[np.ndarray], weights: np.ndarray, rng: np.random.Generator
) -> list[np.ndarray]:
    """Splits each label's samples among the clients holding it, in proportion to their weights."""
    chunks: list[list[np.ndarray]] = [[] for _ in client_labels]
    for label in np.unique(targets):
        holders = [cid for cid, labels in enumerate(client_labels) if label in labels]
        if not holders:
            continue
        indices = rng.permutation(np.flatnonzero(targets == label))
        if len(indices) < len(holders):
            raise ValueError(
                f"label {label} has {len(indices)} samples but {len(holders)} clients hold it; "
                "use fewer clients or fewer labels per client."
            )
        sizes = _proportional_sizes(len(indices), weights[holders])
        for cid, chunk in zip(holders, np.split(indices, np.cumsum(sizes)[:-1]), strict=True):
            chunks[cid].append(chunk)
    return [np.concatenate(client) if client else np.empty(0, dtype=np.int64) for client in chunks]


def _proportional_sizes(total: int, weights: np.ndarray) -> np.ndarray:
    """Integer sizes ``>= 1`` summing to ``total``, proportional to ``weights`` (largest remainder)."""
    quotas = weights / weights.sum() * (total - len(weights))
    sizes: np.ndarray = np.floor(quotas).astype(np.int64)
    leftover = total - len(weights) - int(sizes.sum())
    sizes[np.argsort(sizes - quotas, kind="stable")[:leftover]] += 1
    sizes += 1
    return sizes
