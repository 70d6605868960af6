"""What FedSoft and IFCA share: ``S`` cluster models ("centres") held on the CPU, scored on a
client's data in one batched pass, and evaluated per source distribution and per client."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from fl_lightning.utils.saved_state import InvalidStateError
from fl_lightning.evaluation.protocols import has_client_holdout
from fl_lightning.algorithms.shared.algorithm import Algorithm
from fl_lightning.server.client_store import cpu_copy
from fl_lightning.algorithms.shared.cluster_math import match_clusters
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State, live_tensors, load_into, tensor_bytes
from fl_lightning.evaluation.probe import SupportsSampleMetrics, WeightSets, sample_metrics_many
from fl_lightning.utils.seeding import derive_seed
from fl_lightning.utils.checks import check_integer


def init_centres(module: torch.nn.Module, num_clusters: int, seed: int, names: Collection[str]) -> list[State]:
    """``S`` independent initialisations of ``module``'s tensors ``names`` (the shared ones): every submodule's
    ``reset_parameters()`` run under the seed ``(seed, "centre", s)``; the module's own weights (frozen ones
    included) are left unchanged.

    Identical centres would send every sample to centre 0 (ties go to the lowest index), which is
    why FedSoft's authors initialise each centre independently.
    """
    resettable = [m for m in module.modules() if m is not module and callable(getattr(m, "reset_parameters", None))]
    if not resettable:
        raise ValueError(
            f"{type(module).__name__} has no submodule with `reset_parameters()` to draw independent centres "
            "from; pass the initial centres explicitly (`centres=[...]`)."
        )
    live = live_tensors(module)
    saved = cpu_copy(live)
    devices = sorted({t.device.index for t in live.values() if t.device.type == "cuda"})
    centres = []
    try:
        for s in range(num_clusters):
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(derive_seed(seed, "centre", s))
                for m in resettable:
                    m.reset_parameters()  # type: ignore[operator]
            centres.append(cpu_copy({name: live[name] for name in names}))
    finally:
        load_into(live, saved)
    return centres


def source_metrics(module: pl.LightningModule, states: Sequence[Mapping[str, Tensor]], data: Any, *, batched: bool = True) -> dict[str, float]:
    """Each model's loss (and accuracy) on each source distribution's test samples.

    Needs ``data.test.source_ids`` (the source of every test sample). Keys ``src{d}_c{s}_loss``,
    ``src{d}_c{s}_acc``, and per source the best model ``src{d}_best_loss`` / ``src{d}_best_acc``
    with its index ``src{d}_best_centre`` (lowest loss). Empty without per-source test data.
    """
    test = getattr(data, "test", None)
    sources = getattr(test, "source_ids", None)
    if sources is None:
        return {}
    metrics = sample_metrics_many(module, states, data.test_dataloader(), batched=batched)
    sources_t = torch.as_tensor(np.asarray(sources), device=metrics["loss"].device)
    result: dict[str, float] = {}
    for d in sorted(set(np.asarray(sources).tolist())):
        mask = sources_t == d
        losses = metrics["loss"][:, mask].mean(dim=1).tolist()
        best = int(np.argmin(losses))
        for s, value in enumerate(losses):
            result[f"src{d}_c{s}_loss"] = value
        result[f"src{d}_best_loss"], result[f"src{d}_best_centre"] = losses[best], float(best)
        if "correct" in metrics:
            accs = metrics["correct"][:, mask].mean(dim=1).tolist()
            for s, value in enumerate(accs):
                result[f"src{d}_c{s}_acc"] = value
            result[f"src{d}_best_acc"] = accs[best]
    return result


def personal_metrics(
    module: pl.LightningModule, data: Any, models: Mapping[int, Mapping[str, Tensor]], *, probe_batch_size: int = 512
) -> dict[str, float]:
    """Mean over clients of each client's own model on its training data (``personal_train_*``,
    the paper's :math:`\\bar w`) and on its held-out data (``personal_heldout_*``, when the data
    module holds out samples per client, :func:`~fl_lightning.evaluation.protocols.has_client_holdout`). Each client counts once, whatever its size."""
    totals: dict[str, list[float]] = {}
    heldout = has_client_holdout(data)
    for cid, state in sorted(models.items()):
        streams = {"train": data.client_batches(cid, num_epochs=1, generator=torch.Generator().manual_seed(0), batch_size=probe_batch_size)}
        if heldout:
            streams["heldout"] = data.holdout_dataloader(cid)
        for split, batches in streams.items():
            metrics = sample_metrics_many(module, [state], batches)
            for key, name in (("loss", "loss"), ("correct", "acc")):
                if key in metrics:
                    totals.setdefault(f"personal_{split}_{name}", []).append(metrics[key].mean())
    result = {key: float(torch.stack(values).mean()) for key, values in totals.items()}
    if models:
        result["personal_clients"] = float(len(models))
    return result


def true_importance(data: Any) -> Tensor | None:
    """``[N, S]`` true mixture proportions of the clients' training samples, from
    ``data.train.source_ids`` (``None`` when the data has no ground truth)."""
    sources = getattr(getattr(data, "train", None), "source_ids", None)
    if sources is None or not hasattr(data, "client_indices"):
        return None
    sources = np.asarray(sources)
    num_sources = int(getattr(data.train, "num_sources", sources.max() + 1))
    rows = [np.bincount(sources[data.client_indices(c)], minlength=num_sources) for c in range(data.num_clients)]
    counts = torch.as_tensor(np.stack(rows), dtype=torch.float64)
    return counts / counts.sum(dim=1, keepdim=True)


class ClusteredAlgorithm(Algorithm):
    """Base of FedSoft and IFCA: ``S`` centres on the CPU, a device copy for the round, batched probes.

    The loop's global model is **centre 0**: after each aggregation it is written into the loop's
    master copy, so the module holds it between rounds, Lightning's validation loop
    (``val_*``) evaluates it and checkpoints store it as the model's weights. All centres (and
    the clients' own models) are evaluated in :meth:`evaluate`.

    Args:
        num_clusters: :math:`S \\ge 1`.
        centres: initial centres (``S`` mappings of ``state_dict`` tensors); default: ``S``
            independent initialisations (:func:`init_centres`, seeded from the trainer's seed).
        batched_probe: score the ``S`` centres in one ``vmap``-ed pass (else one pass each).
        personal_eval_every: evaluate the clients' own models every this many rounds and at
            the last round (0: never).
        probe_batch_size: batch size of the loss probes on clients' data.
        evaluate_sources: evaluate every centre on each source's **test** samples every round
            (``src{d}_c{s}_*``, the papers' curves). Off by default: ``fit`` reads the test set only
            when asked to, and these are reports, never for model selection (``docs/evaluation.md``).
    """

    #: Whether :meth:`estimated_importance` is free (kept as state) rather than probing every client.
    importance_is_state: ClassVar[bool] = True

    def __init__(
        self,
        *,
        num_clusters: int,
        centres: Sequence[Mapping[str, Tensor]] | None = None,
        batched_probe: bool = True,
        personal_eval_every: int = 1,
        probe_batch_size: int = 512,
        evaluate_sources: bool = False,
    ) -> None:
        if isinstance(num_clusters, bool) or not isinstance(num_clusters, int) or num_clusters < 1:
            raise ValueError(f"The number of clusters S (`num_clusters`) must be an int >= 1, got {num_clusters!r}.")
        if centres is not None and len(centres) != num_clusters:
            raise ValueError(f"Got {len(centres)} initial centres for num_clusters={num_clusters}.")
        check_integer("personal_eval_every", personal_eval_every, minimum=0)
        check_integer("probe_batch_size", probe_batch_size, minimum=1)
        self.num_clusters = num_clusters
        self.batched_probe = batched_probe
        self.personal_eval_every = personal_eval_every
        self.probe_batch_size = probe_batch_size
        self.evaluate_sources = evaluate_sources
        self.centres: list[State] = [cpu_copy(c) for c in centres] if centres is not None else []
        self._device_centres: list[State] | None = None
        self._probe_weights: WeightSets | None = None
        self._truth: Tensor | None = None

    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        module = federation.module
        if not isinstance(module, SupportsSampleMetrics):
            raise TypeError(
                f"{type(self).__name__} scores centres on clients' samples: {type(module).__name__} must implement "
                "`sample_metrics(batch) -> {'loss': Tensor[B], ...}` (ClassificationModule and LinearRegression do)."
            )
        if not self.centres:
            self.centres = init_centres(module, self.num_clusters, federation.seed, federation.local_weights())
        missing = set(self.federation.local_weights()) - set(self.centres[0])
        if missing:
            raise ValueError(f"The initial centres lack the module's tensors {sorted(missing)}.")
        if any(all(torch.equal(a[k], b[k]) for k in a) for i, a in enumerate(self.centres) for b in self.centres[i + 1 :]):
            rank_zero_warn("Some cluster centres are identical: their samples all go to the lower-indexed centre.")
        self._device_centres = self._probe_weights = None
        self._truth = true_importance(federation.data)

    # --- centres -------------------------------------------------------------------------

    def centres_on_device(self) -> list[State]:
        """The centres on the module's device, cached until they change (``S`` models, whatever ``N``)."""
        if self._device_centres is None:
            live = self.federation.local_weights()
            self._device_centres = [
                {k: v.to(device=live[k].device, dtype=live[k].dtype) for k, v in c.items() if k in live}
                for c in self.centres
            ]
        return self._device_centres

    def set_centres(self, centres: Sequence[Mapping[str, Tensor]], global_state: State) -> None:
        """Replaces the centres (CPU copies) and writes centre 0 into the loop's global model."""
        self.centres = [cpu_copy(c) for c in centres]
        self._device_centres = self._probe_weights = None
        load_into(global_state, self.centres[0])

    def centre_losses(self, cid: int) -> Tensor:
        """``[n_k, S]`` losses of every centre on every training sample of client ``cid``."""
        batches = self.federation.probe_batches(cid, batch_size=self.probe_batch_size)
        if self._probe_weights is None:  # stacked once per set of centres, not once per client
            self._probe_weights = WeightSets(self.federation.module, self.centres_on_device())
        return sample_metrics_many(self.federation.module, self._probe_weights, batches, batched=self.batched_probe)["loss"].T

    def download_bytes(self, global_state: State) -> int:
        """A selected client downloads all ``S`` centres."""
        return self.num_clusters * tensor_bytes(global_state)

    # --- evaluation ----------------------------------------------------------------------

    def estimated_importance(self) -> Tensor | None:
        """``[N, S]`` current estimate of the clients' mixtures (compared with the truth in :meth:`evaluate`)."""
        return None

    def personal_models(self) -> dict[int, Mapping[str, Tensor]]:
        """Each client's own model for the personalised metrics."""
        return {}

    def evaluate(self, round_idx: int, module: pl.LightningModule) -> dict[str, float]:
        """Per-source test metrics of every centre (with ``evaluate_sources``), the importance
        error against the ground truth (when the data has it) and, every ``personal_eval_every`` rounds, personalised metrics
        (and the importance error too when estimating it probes every client)."""
        data = self.federation.data
        metrics = source_metrics(module, self.centres_on_device(), data, batched=self.batched_probe) if self.evaluate_sources else {}
        last = self.federation.num_rounds is not None and round_idx == self.federation.num_rounds - 1
        every = self.personal_eval_every
        personal_round = bool(every) and (round_idx % every == every - 1 or last)
        if self._truth is not None and (self.importance_is_state or personal_round):
            estimate = self.estimated_importance()
            if estimate is not None and self._truth.shape == estimate.shape:
                error, perm = match_clusters(estimate, self._truth)
                metrics["u_error"] = error
                metrics.update({f"c{s}_source": float(d) for s, d in enumerate(perm)})
        if personal_round:
            metrics.update(personal_metrics(module, data, self.personal_models(), probe_batch_size=self.probe_batch_size))
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"centres": [dict(c) for c in self.centres]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the centres, one per cluster (else :class:`~fl_lightning.utils.saved_state.InvalidStateError`)."""
        centres = state["centres"]
        if not isinstance(centres, list) or len(centres) != self.num_clusters:
            found = len(centres) if isinstance(centres, list) else type(centres).__name__
            raise InvalidStateError(f"`centres` must hold num_clusters={self.num_clusters} centres, got {found}.")
        self.centres = [{k: v.cpu() for k, v in c.items()} for c in centres]
        self._device_centres = self._probe_weights = None
