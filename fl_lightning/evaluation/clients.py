"""Each client's loss and accuracy on its own held-out data, for the global and its own model.

Built on the probes of :mod:`fl_lightning.evaluation.probe` (no-grad, eval mode, BatchNorm statistics and
training modes untouched). When every client's held-out loader is a plain sequential
``DataLoader``, all clients are scored in **one** pass over the concatenation of their data and
the per-sample metrics are split back by client: one forward per batch of ``eval_batch_size``
samples instead of one DataLoader and one small forward per client. Other held-out iterables
are scored client by client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import ConcatDataset, DataLoader, SequentialSampler, Subset, default_collate

from fl_lightning.evaluation.protocols import SupportsHoldout
from fl_lightning.evaluation.results import ClientEvaluation
from fl_lightning.evaluation.probe import sample_metrics, sample_metrics_many

Score = Callable[[Iterable[Any]], dict[str, Tensor]]


def evaluate_clients(
    module: pl.LightningModule,
    data: SupportsHoldout,
    client_ids: Sequence[int],
    personalized: Callable[[int], Mapping[str, Tensor] | None] | None = None,
) -> list[ClientEvaluation]:
    """Scores ``module`` (the global model) and, with ``personalized``, each client's own model
    on each client's held-out data.

    Clients without held-out samples are left out. Each distinct personal model (by identity) is
    scored once, on the pooled data of the clients that share it (IFCA: one pass per centre).

    Returns:
        One :class:`ClientEvaluation` per evaluated client, in ``client_ids`` order.
    """
    loaders = {cid: data.holdout_dataloader(cid) for cid in client_ids}
    own = _client_means(lambda batches: sample_metrics(module, batches), loaders)
    personal: dict[int, dict[str, float]] = {}
    if personalized is not None:
        shared: dict[int, tuple[Mapping[str, Tensor], list[int]]] = {}
        for cid in own:
            state = personalized(cid)
            if state is not None:
                shared.setdefault(id(state), (state, []))[1].append(cid)
        for state, cids in shared.values():
            personal.update(_client_means(_state_scorer(module, state), {c: loaders[c] for c in cids}))
    return [
        ClientEvaluation(
            client_id=cid,
            num_samples=int(m["n"]),
            loss=m["loss"],
            accuracy=m.get("correct"),
            personal_loss=personal.get(cid, {}).get("loss"),
            personal_accuracy=personal.get(cid, {}).get("correct"),
        )
        for cid, m in own.items()
    ]


def _state_scorer(module: pl.LightningModule, state: Mapping[str, Tensor]) -> Score:
    """Scores one weight set through ``torch.func.functional_call``: the module's own weights are not touched."""
    return lambda batches: {key: value[0] for key, value in sample_metrics_many(module, [state], batches).items()}


def _client_means(score: Score, loaders: Mapping[int, Iterable[Any]]) -> dict[int, dict[str, float]]:
    """``{client: {"n": samples, "loss": mean, "correct": mean (if reported)}}`` of the non-empty clients."""
    if all(_poolable(loader) for loader in loaders.values()):
        sizes = {cid: len(loader.dataset) for cid, loader in loaders.items()}  # type: ignore[attr-defined, arg-type]
        ids = [cid for cid, n in sizes.items() if n]
        if not ids:
            return {}
        return _split_means(score(_pooled([loaders[c] for c in ids])), ids, [sizes[c] for c in ids])  # type: ignore[misc]
    result = {}
    for cid, loader in loaders.items():
        metrics = score(loader)
        if "loss" in metrics and len(metrics["loss"]):
            result.update(_split_means(metrics, [cid], [len(metrics["loss"])]))
    return result


def _poolable(loader: Any) -> bool:
    """A sequential, fixed-batch-size ``DataLoader`` over a sized dataset: its samples can be concatenated."""
    return (
        isinstance(loader, DataLoader)
        and isinstance(loader.sampler, SequentialSampler)
        and loader.batch_size is not None
        and hasattr(loader.dataset, "__len__")
    )


def _pooled(loaders: Sequence[DataLoader[Any]]) -> Iterable[Any]:
    """One sequential pass over the clients' datasets, in order, with the first loader's batching.

    Subsets of one dataset with ``tensors`` (``InMemoryDataset``, ``TensorDataset``) are cut by
    indexing, as :func:`~fl_lightning.data.client_batches` does, without a ``__getitem__`` per sample.
    """
    first = loaders[0]
    base = getattr(first.dataset, "dataset", None)
    tensors = getattr(base, "tensors", None)
    if (
        tensors is not None
        and first.collate_fn is default_collate
        and all(isinstance(loader.dataset, Subset) and loader.dataset.dataset is base for loader in loaders)
    ):
        indices = np.concatenate([np.asarray(loader.dataset.indices) for loader in loaders])
        index = torch.as_tensor(indices, device=tensors[0].device)
        return [tuple(t[chunk] for t in tensors) for chunk in index.split(first.batch_size)]  # type: ignore[arg-type]
    return DataLoader(
        ConcatDataset([loader.dataset for loader in loaders]),
        batch_size=first.batch_size,
        shuffle=False,
        collate_fn=first.collate_fn,
        num_workers=first.num_workers,
    )


def _split_means(metrics: dict[str, Tensor], ids: Sequence[int], sizes: Sequence[int]) -> dict[int, dict[str, float]]:
    """Per-client means of concatenated per-sample metrics (one host sync)."""
    counts = torch.tensor(sizes, dtype=torch.float64)
    owner = torch.repeat_interleave(torch.arange(len(ids)), torch.tensor(sizes)).to(metrics["loss"].device)
    keys = list(metrics)
    sums = torch.stack(
        [torch.zeros(len(ids), dtype=torch.float64, device=owner.device).index_add_(0, owner, metrics[k].double()) for k in keys]
    ).cpu()
    means = (sums / counts).tolist()
    return {cid: {"n": float(n), **{k: means[j][i] for j, k in enumerate(keys)}} for i, (cid, n) in enumerate(zip(ids, sizes))}
