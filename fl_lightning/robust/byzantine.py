"""Byzantine clients: a seeded fraction of the federation runs an :class:`~fl_lightning.robust.attacks.Attack`."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sized
from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper
from fl_lightning.privacy.local_dp import uploads_plain_delta
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State
from fl_lightning.robust.attacks import Attack
from fl_lightning.utils.seeding import make_generator


def malicious_clients(num_clients: int, fraction: float, seed: int) -> frozenset[int]:
    """:math:`\\lfloor fN + \\tfrac12 \\rfloor` clients (:math:`fN` rounded half up: 2.5 gives 3, 3.5 gives 4) drawn
    without replacement from a generator seeded by ``(seed, "malicious")``."""
    order = torch.randperm(num_clients, generator=make_generator(seed, "malicious"))
    return frozenset(order[: math.floor(fraction * num_clients + 0.5)].tolist())


class _MappedBatches:
    """A client's batch stream with ``transform`` applied to each batch, its length kept."""

    def __init__(self, batches: Sized, transform: Callable[[Any], Any]) -> None:
        self.batches, self.transform = batches, transform

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        return (self.transform(batch) for batch in self.batches)  # type: ignore[attr-defined]


class _PoisonedData:
    """The federation's data, with the malicious clients' batches poisoned; everything else delegated."""

    def __init__(self, data: Any, malicious: frozenset[int], attack: Attack) -> None:
        self._data, self._malicious, self._attack = data, malicious, attack

    def __getattr__(self, name: str) -> Any:
        return getattr(self._data, name)

    def client_batches(self, cid: int, **kwargs: Any) -> Any:
        batches = self._data.client_batches(cid, **kwargs)
        if cid not in self._malicious:
            return batches
        return _MappedBatches(batches if isinstance(batches, Sized) else list(batches), self._attack.poison_batch)


class Byzantine(AlgorithmWrapper):
    """Runs ``algorithm`` with a fraction of malicious clients that follow ``attack``.

    The malicious clients are drawn once, at set-up, from ``(seed, "malicious")``; each poisons its
    batches (:meth:`Attack.poison_batch`, through the federation's data as this wrapper sees it) and
    its delta before the wrapped algorithm packs it (:meth:`Attack.poison_update`, with a generator
    seeded by ``(client seed, "attack")``), so compression and server-side checks see the poisoned
    update. The attack is client-side, so the wrapper shards over processes when ``algorithm`` does.
    ``round/malicious_clients`` counts the round's (or the asynchronous buffer's) aggregated malicious
    participants, sharded rounds included.

    Args:
        attack: e.g. ``SignFlip()``, ``ScaledUpdate(scale=10)``, ``GaussianUpdate(std=1)``, ``LabelFlip(num_classes=10)``.
        fraction: share of the federation that is malicious, in [0, 1); the count is :math:`fN` rounded half up
            (:func:`malicious_clients`).
        algorithm: the algorithm the honest clients run (default :class:`FedAvg`), synchronous or buffered
            asynchronous (FedBuff, FedStaleWeight: malicious clients poison each update they send). Model poisoning
            needs an upload computed from the delta (:func:`~fl_lightning.privacy.local_dp.uploads_plain_delta`);
            over FedMRN, FedSoft and codecs only data poisoning (``LabelFlip``) is accepted.
    """

    malicious: frozenset[int]

    def __init__(self, *, attack: Attack, fraction: float, algorithm: Algorithm | None = None) -> None:
        if not isinstance(attack, Attack):
            raise TypeError(f"`attack` must be a fl_lightning.robust.Attack, got {type(attack).__name__}.")
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
            raise ValueError(f"`fraction` must be a number in [0, 1), got {fraction!r}.")
        self.attack, self.fraction = attack, float(fraction)
        super().__init__(algorithm)
        if attack.poisons_update and not uploads_plain_delta(self.inner):
            raise ValueError(
                f"Byzantine's {type(attack).__name__} poisons the client's delta, but {type(self.inner).__name__} uploads something "
                "else (a model, masks, a codec's payload) that the poisoned delta would not reach; use a data-poisoning "
                "attack (LabelFlip) with it."
            )

    @override
    def setup(self, federation: Federation) -> None:
        self.malicious = malicious_clients(federation.num_clients, self.fraction, federation.seed)
        if self.attack.poisons_data:
            self._check_batches(federation)
            federation = replace(federation, data=_PoisonedData(federation.data, self.malicious, self.attack))
        super().setup(federation)

    def _check_batches(self, federation: Federation) -> None:
        """Poisons one batch of a malicious client now, so a batch the attack cannot read (e.g. ``LabelFlip``
        on a batch without labels it can find) fails at set-up with the attack's error, not mid-run."""
        if self.malicious:
            batch = next(iter(federation.probe_batches(min(self.malicious), batch_size=2)), None)
            if batch is not None:
                self.attack.poison_batch(batch)

    @override
    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        if client.client_id in self.malicious:
            delta = self.attack.poison_update(delta, make_generator(client.seed, "attack"))
        return self.inner.client_update(client, module, delta)

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        return {**self.inner.aggregate(round_idx, global_state, updates), **self._count(updates)}

    @override
    def report_metrics(self, reports: list[ClientUpdate]) -> dict[str, float]:
        """With client sharding: the inner algorithm's metrics and the malicious count, from the all-reduced reports."""
        return {**super().report_metrics(reports), **self._count(reports)}

    def _count(self, updates: list[ClientUpdate]) -> dict[str, float]:
        return {"malicious_clients": float(sum(u.client_id in self.malicious for u in updates))}
