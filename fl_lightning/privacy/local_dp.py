"""Local differential privacy: every client clips and noises its own delta before it leaves the device."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

from fl_lightning.algorithms.shared.base import Algorithm, ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper
from fl_lightning.model_state import State
from fl_lightning.privacy.accountant import check_delta, gaussian_epsilon
from fl_lightning.update_bounds import positive_finite, update_norm
from fl_lightning.utils.seeding import make_generator


def uploads_plain_delta(algorithm: Algorithm) -> bool:
    """Whether the algorithm's upload is computed from the delta alone (the default ``client_update``,
    or a wrapper that forwards it), so noise added to the delta reaches everything the client sends."""
    method = type(algorithm).client_update
    if method is Algorithm.client_update:
        return True
    return method is AlgorithmWrapper.client_update and uploads_plain_delta(algorithm.inner)  # type: ignore[attr-defined]


class LocalDP(AlgorithmWrapper):
    r"""Each client releases :math:`\Delta_k \min(1, C/\lVert\Delta_k\rVert) + \mathcal N(0, z^2C^2 I)`
    (the Gaussian mechanism, Dwork & Roth 2014, Thm. A.1, applied on the device); integer buffers are
    not released. The server and everything after it see only noised updates.

    Accounting: two datasets of one client give clipped deltas at most :math:`2C` apart, so a round
    is a Gaussian mechanism of multiplier :math:`z/2`; ``round/local_dp_epsilon`` is ε at ``delta``
    after as many rounds as have run (RDP composition, ``dp-accounting``), a bound for a client
    that took part in every one (sampling does not hide a client from the server it talks to).

    Composes with any synchronous algorithm whose upload is computed from the delta alone
    (:func:`uploads_plain_delta`: FedAvg, FedProx, server optimizers, FedALIGN over them, the robust
    aggregators); refused for uploads that are models or masks (FedSoft, FedPM, FedMRN), codecs
    (CompressedFedAvg) and the asynchronous algorithms.

    Args:
        noise_multiplier: :math:`z > 0`.
        clip_norm: :math:`C > 0`.
        delta: :math:`\delta \in (0, 1)` at which ε is reported.
        algorithm: the wrapped algorithm (default :class:`~fl_lightning.FedAvg`).
    """

    def __init__(
        self, *, noise_multiplier: float, clip_norm: float, delta: float = 1e-5, algorithm: Algorithm | None = None
    ) -> None:
        self.noise_multiplier = positive_finite("noise_multiplier", noise_multiplier)
        self.clip_norm = positive_finite("clip_norm", clip_norm)
        self.delta = check_delta(delta)
        super().__init__(algorithm)
        if self.inner.asynchronous or not uploads_plain_delta(self.inner):
            raise ValueError(
                f"LocalDP noises the client's delta, but {type(self.inner).__name__} uploads something else "
                "(a model, masks, a codec's payload) or is asynchronous; wrap FedAvg, FedProx, FedALIGN or a robust aggregator."
            )
        self.rounds_done = 0

    @override
    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        scale = min(1.0, self.clip_norm / norm) if (norm := update_norm(delta)) > 0 else 1.0
        std, generator = self.noise_multiplier * self.clip_norm, make_generator(client.seed, "local_dp")
        noised = {
            name: t * scale + (torch.randn(t.shape, generator=generator) * std).to(t)
            if t.is_floating_point()
            else torch.zeros_like(t)
            for name, t in delta.items()
        }
        return self.inner.client_update(client, module, noised)

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        return self._accounted(super().aggregate(round_idx, global_state, updates))

    @override
    def apply_weighted_sum(self, round_idx: int, global_state: State, total: State, weight: float) -> dict[str, float]:
        return self._accounted(super().apply_weighted_sum(round_idx, global_state, total, weight))

    def _accounted(self, metrics: dict[str, float]) -> dict[str, float]:
        self.rounds_done += 1
        return {**metrics, "local_dp_epsilon": gaussian_epsilon(self.noise_multiplier / 2, self.rounds_done, self.delta)}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rounds_done": self.rounds_done}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.rounds_done = int(state["rounds_done"])
