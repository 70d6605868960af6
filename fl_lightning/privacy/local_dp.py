"""Local differential privacy: every client clips and noises its own delta before it leaves the device."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper, wrapped
from fl_lightning.data._data_checks import check_bool
from fl_lightning.server.model_state import State
from fl_lightning.server.federation import Federation
from fl_lightning.privacy.accountant import check_delta, composed_gaussian_epsilon
from fl_lightning.privacy.ledger import Ledger, check_count
from fl_lightning.privacy.noise import check_secure_mode, noise_source, start_noise
from fl_lightning.privacy.mechanism import DPMechanism
from fl_lightning.robust.update_bounds import positive_finite, update_norm


def uploads_plain_delta(algorithm: Algorithm) -> bool:
    """Whether the algorithm's upload is computed from the delta alone (the default ``client_update``,
    or a wrapper that forwards it), so noise added to the delta reaches everything the client sends."""
    method = type(algorithm).client_update
    if method is Algorithm.client_update:
        return True
    return method is AlgorithmWrapper.client_update and uploads_plain_delta(algorithm.inner)  # type: ignore[attr-defined]


class LocalDP(DPMechanism, AlgorithmWrapper):
    r"""Each client releases :math:`\Delta_k \min(1, C/\lVert\Delta_k\rVert) + \mathcal N(0, z^2C^2 I)`
    (the Gaussian mechanism, Dwork & Roth 2014, Thm. A.1, applied on the device); integer buffers are
    not released. The server and everything after it see only noised updates.

    Accounting: two datasets of one client give clipped deltas at most :math:`2C` apart, so a round
    is a Gaussian mechanism of multiplier :math:`z/2`; ``round/local_dp_epsilon`` is ε at ``delta``
    after as many rounds as have run (RDP composition, ``dp-accounting``), a bound for a client
    that took part in every one (sampling does not hide a client from the server it talks to).
    In asynchronous runs (FedBuff, FedStaleWeight) a client may send several updates per
    aggregation, or none: there ε is that of the most uploads any client has made so far (counted
    from the updates that reach the aggregations). ε composes what was released: a run resumed with
    another ``noise_multiplier`` keeps the releases made at the old one (per noise multiplier, the
    most uploads of any client: a bound for every client).

    Noise: with ``secure_mode`` from a secret no logged or saved value determines
    (:mod:`fl_lightning.privacy.noise`); without it (research mode, with a warning) from
    ``(client seed, "local_dp")``, which the server, knowing the run's seed, can regenerate and strip.

    Nobody is trusted, so the server reads nothing of a client but its noised payload: the upload carries no
    training metrics (its loss) unless ``log_client_statistics``, and an algorithm that reads an unnoised
    client value (:meth:`~fl_lightning.Algorithm.unnoised_client_values`) is refused inside LocalDP or around
    it, naming both: sample-count weighting (``FedAvg(weighting="samples")``, LocalDP weights uniformly by
    default and refuses an explicit ``"samples"``), FedNova's step counts, FlexibleParticipation's counts,
    FedALIGN's loss admission. The simulated ``ClientUpdate`` still holds the sample and step counts, which
    no accepted server step reads; the logger's step axis counts every client's steps (outside the guarantee,
    ``docs/privacy_robustness.md``).

    Composes with any algorithm whose upload is computed from the delta alone
    (:func:`uploads_plain_delta`: FedAvg and FedProx with uniform weights, server optimizers, the robust
    aggregators, FedBuff, FedStaleWeight); refused for uploads that are models or masks (FedSoft,
    FedPM, FedMRN: a mask or model cannot carry the noise) and codecs (CompressedFedAvg).

    Args:
        noise_multiplier: :math:`z > 0`.
        clip_norm: :math:`C > 0`.
        delta: :math:`\delta \in (0, 1)` at which ε is reported.
        secure_mode: draw the noise from a secret instead of the client's seed.
        log_client_statistics: clients also send their training metrics, and the round logs its unnoised
            client statistics (as :class:`~fl_lightning.DPFedAvg`); outside the guarantee.
        algorithm: the wrapped algorithm (default ``FedAvg(weighting="uniform")``).
    """

    neighbouring_relation = "replace-one, per client"

    def __init__(
        self,
        *,
        noise_multiplier: float,
        clip_norm: float,
        delta: float = 1e-5,
        secure_mode: bool = False,
        log_client_statistics: bool = False,
        algorithm: Algorithm | None = None,
    ) -> None:
        self.noise_multiplier = positive_finite("noise_multiplier", noise_multiplier)
        self.clip_norm = positive_finite("clip_norm", clip_norm)
        self.delta = check_delta(delta)
        self.secure_mode = check_secure_mode(secure_mode)
        self.log_client_statistics = check_bool("log_client_statistics", log_client_statistics)
        super().__init__(algorithm if algorithm is not None else FedAvg(weighting="uniform"))
        if not uploads_plain_delta(self.inner):
            raise ValueError(
                f"LocalDP noises the client's delta, but {type(self.inner).__name__} uploads something else "
                "(a model, masks, a codec's payload); wrap FedAvg, FedProx, FedBuff or a robust aggregator."
            )
        for layer in wrapped(self.inner):
            if reads := layer.unnoised_client_values():
                name = type(layer).__name__
                raise ValueError(
                    f"LocalDP and {name} cannot be combined: {name} reads {reads}, which the server would see in the "
                    "clear, so LocalDP's guarantee (nobody is trusted) would not hold."
                )
        #: Releases per noise multiplier: rounds (synchronous) or the most uploads of any client (asynchronous).
        self.spent = Ledger()
        #: Updates of each client that reached an aggregation at the current noise multiplier (asynchronous runs).
        self.uploads: dict[int, int] = {}
        self._secret: bytes | None = None

    @override
    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        self._secret = start_noise("LocalDP", self.secure_mode)

    @override
    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        scale = min(1.0, self.clip_norm / norm) if (norm := update_norm(delta)) > 0 else 1.0
        std, source = self.noise_multiplier * self.clip_norm, noise_source(self._secret, client.seed, "local_dp")
        noised = {
            name: t * scale + (source.normal(t.shape, torch.get_default_dtype()) * std).to(t)
            if t.is_floating_point()
            else torch.zeros_like(t)
            for name, t in delta.items()
        }
        update = self.inner.client_update(client, module, noised)
        return update if self.log_client_statistics else replace(update, metrics={})

    @override
    def epsilon(self) -> float:
        """Each client's ε at δ so far (a bound for a client in every release)."""
        return composed_gaussian_epsilon(tuple(self.spent.entries), self.delta)

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        if self.asynchronous:
            for update in updates:
                self.uploads[update.client_id] = self.uploads.get(update.client_id, 0) + 1
        return self._accounted(super().aggregate(round_idx, global_state, updates))

    @override
    def apply_weighted_sum(self, round_idx: int, global_state: State, total: State, weight: float) -> dict[str, float]:
        return self._accounted(super().apply_weighted_sum(round_idx, global_state, total, weight))

    def _accounted(self, metrics: dict[str, float]) -> dict[str, float]:
        # Two datasets of one client give clipped deltas up to 2C apart: each release is a Gaussian of multiplier z/2.
        setting = (self.noise_multiplier / 2,)
        if not self.asynchronous:
            self.spent.spend(setting)
        else:
            counted = self.spent.entries[-1][1] if self.spent.entries and self.spent.entries[-1][0] == setting else 0
            self.spent.spend(setting, max(self.uploads.values(), default=0) - counted)
        return {**metrics, "local_dp_epsilon": self.epsilon()}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "spent": self.spent.state_dict(), "uploads": dict(self.uploads)}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the ledger and upload counts, each checked (a tampered entry raises ValueError naming it);
        a checkpoint from before the ledger holds ``rounds_done``, accounted at the current noise multiplier."""
        super().load_state_dict(state)
        setting = (self.noise_multiplier / 2,)
        if "spent" in state:
            self.spent = Ledger.from_state(state["spent"], "spent", width=1)
        else:
            rounds = check_count("rounds_done", state["rounds_done"])
            uploads = max(state.get("uploads", {}).values(), default=0)
            self.spent = Ledger(((setting, uploads if self.asynchronous else rounds),))
        uploads = state.get("uploads", {})
        self.uploads = {check_count("uploads", cid): check_count(f"uploads[{cid}]", n) for cid, n in uploads.items()}
        if self.spent.entries and self.spent.entries[-1][0] != setting:
            self.uploads = {}  # a new noise multiplier starts a new count of uploads
