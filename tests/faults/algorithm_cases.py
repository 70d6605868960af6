"""The registry of every exported algorithm with a small instance, its models, data and one-bad-client fault:
shared by the counter tests (issue 15) and the "what is federated" matrix (issue 37)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

import lightning.pytorch as pl
from torch import nn

import fl_lightning
from fl_lightning import (
    IFCA,
    AllClients,
    Algorithm,
    Bulyan,
    CompressedFedAvg,
    CoordinateMedian,
    Ditto,
    DPFedAvg,
    FedALIGN,
    FedAvg,
    FedAsync,
    FedAvgSM,
    FedBN,
    FedDyn,
    FedNova,
    FedPer,
    LGFedAvg,
    QFedAvg,
    SCAFFOLD,
    FedBuff,
    FedEM,
    FederatedCallback,
    FedMRN,
    FedMRNS,
    FedPM,
    FedProx,
    FedSoft,
    FedStaleWeight,
    FlexibleParticipation,
    Krum,
    LocalOnly,
    MaskedNoiseMixin,
    MixtureWeightedMixin,
    PriorityOnly,
    ProbabilityMaskMixin,
    TrimmedMean,
)
from fl_lightning.compression import TopKCodec, as_wire, from_wire
from fl_lightning.models import LogisticRegression
from fl_lightning.participation import ConstantDelay

from ..federated_models import Adapter, MaskedAdapter, MixtureAdapter, ProbabilityMaskedAdapter, adapter
from .aggregate_helpers import Poison, tiny_model

VICTIM = 0  # selected in every algorithm's first round (FedBuff: in the first buffer)


class MaskedLogisticRegression(MaskedNoiseMixin, LogisticRegression):
    pass


class ProbabilityMaskedLogisticRegression(ProbabilityMaskMixin, LogisticRegression):
    pass


class MixtureLogisticRegression(MixtureWeightedMixin, LogisticRegression):
    pass


class BatchNormLogisticRegression(LogisticRegression):
    def __init__(self) -> None:
        super().__init__(in_features=3, num_classes=2, lr=0.1)
        self.net = nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 2))


class CorruptPayload(FederatedCallback):
    """Cuts the last byte off the victim's first compressed upload: a malformed payload."""

    def __init__(self) -> None:
        self.done = False

    def on_client_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, client: Any, update: Any) -> None:
        if client.client_id == VICTIM and not self.done:
            update.payload = as_wire(from_wire(update.payload)[:-1])
            self.done = True


#: The frozen-base model of a case: the adapter, whose base Linear and BatchNorm do not require grad.
FROZEN_ADAPTER = partial(adapter, Adapter)


def compressed(model: Callable[[], pl.LightningModule] = tiny_model, frozen_model: Callable[[], Adapter] = FROZEN_ADAPTER) -> dict[str, Any]:
    return {"model": model, "frozen_model": frozen_model, "fault": CorruptPayload, "outcome": "rejected"}


def dense(**kwargs: Any) -> dict[str, Any]:
    return {
        "model": tiny_model,
        "frozen_model": FROZEN_ADAPTER,
        "fault": lambda: Poison({VICTIM}, float("nan"), limit=1),
        "outcome": "dropped",
        **kwargs,
    }


def _masked(cls: type) -> Callable[[], pl.LightningModule]:
    return lambda: cls(in_features=3, num_classes=2, lr=0.1)


#: Per exported algorithm: a small instance, its model (``model``; ``frozen_model``: the same with a frozen base),
#: the one-bad-client fault and how it is counted.
CASES: dict[type[Algorithm], tuple[Callable[[], Algorithm], dict[str, Any]]] = {
    FedAvg: (FedAvg, dense()),
    FedProx: (lambda: FedProx(mu=0.1), dense()),
    FedALIGN: (lambda: FedALIGN(priority=2, warmup_fraction=0.0, evaluate_priority=False), dense()),
    AllClients: (lambda: AllClients(priority=2, warmup_fraction=0.0, evaluate_priority=False), dense()),
    PriorityOnly: (lambda: PriorityOnly(priority=2, warmup_fraction=0.0, evaluate_priority=False), dense()),
    FlexibleParticipation: (FlexibleParticipation, dense()),
    FedSoft: (lambda: FedSoft(num_clusters=2, clients_per_cluster=4, personal_eval_every=0), dense()),
    IFCA: (lambda: IFCA(num_clusters=2, personal_eval_every=0), dense()),
    FedBuff: (lambda: FedBuff(buffer_size=2, delays=ConstantDelay(1.0)), dense()),
    FedStaleWeight: (lambda: FedStaleWeight(buffer_size=2, delays=ConstantDelay(1.0)), dense()),
    FedAsync: (lambda: FedAsync(alpha=0.5, delays=ConstantDelay(1.0)), dense()),
    CompressedFedAvg: (lambda: CompressedFedAvg(codec=TopKCodec(density=0.5)), compressed()),
    FedMRN: (FedMRN, compressed(_masked(MaskedLogisticRegression), partial(adapter, MaskedAdapter))),
    FedMRNS: (FedMRNS, compressed(_masked(MaskedLogisticRegression), partial(adapter, MaskedAdapter))),
    FedPM: (FedPM, compressed(_masked(ProbabilityMaskedLogisticRegression), partial(adapter, ProbabilityMaskedAdapter))),
    # FedEM trains component 1 through the loop inside client_update, so on_client_end fires for
    # it first: poisoning two updates reaches the victim's upload.
    FedEM: (
        lambda: FedEM(num_components=2, personal_eval_every=0),
        {
            **dense(),
            "model": _masked(MixtureLogisticRegression),
            "frozen_model": partial(adapter, MixtureAdapter),
            "fault": lambda: Poison({VICTIM}, float("nan"), limit=2),
        },
    ),
    # Its client statistics logged: the fault tests read the counts of dropped and rejected clients.
    DPFedAvg: (lambda: DPFedAvg(noise_multiplier=0.5, clip_norm=1.0, log_client_statistics=True), dense()),
    # Ditto's personal pass (inside client_update) ends first, with an empty upload: the second poisoning hits.
    Ditto: (lambda: Ditto(lam=0.1), {**dense(), "fault": lambda: Poison({VICTIM}, float("nan"), limit=2)}),
    # FedBN's frozen-base model: the base Linear frozen, the BatchNorm trained and kept on each client.
    FedBN: (FedBN, dense(model=BatchNormLogisticRegression, frozen_model=partial(adapter, frozen=("base",)))),
    # The personal-layer methods on the adapter with nothing frozen (LogisticRegression has one layer only).
    FedPer: (lambda: FedPer(personal=["net.head"]), dense(model=partial(adapter, frozen=()))),
    LGFedAvg: (lambda: LGFedAvg(local=["net.adapter"]), dense(model=partial(adapter, frozen=()))),
    FedNova: (FedNova, dense()),
    QFedAvg: (lambda: QFedAvg(q=1.0), dense()),
    SCAFFOLD: (SCAFFOLD, dense()),
    FedDyn: (lambda: FedDyn(alpha=0.1), dense()),
    FedAvgSM: (FedAvgSM, compressed()),
    LocalOnly: (lambda: LocalOnly(clients=[0, 1, 2, 3]), dense(data={"holdout_fraction": 0.25})),
    CoordinateMedian: (CoordinateMedian, dense()),
    TrimmedMean: (lambda: TrimmedMean(beta=0.2), dense()),
    Krum: (lambda: Krum(num_byzantine=0, num_selected=2), dense()),
    Bulyan: (lambda: Bulyan(num_byzantine=0), dense()),
}


def exported_algorithms() -> set[type]:
    exported = (getattr(fl_lightning, name) for name in fl_lightning.__all__)
    return {obj for obj in exported if inspect.isclass(obj) and issubclass(obj, Algorithm) and not inspect.isabstract(obj)}
