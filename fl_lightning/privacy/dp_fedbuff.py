"""Central, user-level differential privacy over buffered asynchronous FL (FedBuff, FedStaleWeight)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch

from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from fl_lightning.algorithms.fedbuff import FedBuff
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientUpdate
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper
from fl_lightning.server.model_state import State
from fl_lightning.server.federation import Federation
from fl_lightning.data._data_checks import check_bool
from fl_lightning.privacy.accountant import check_delta, composed_gaussian_epsilon
from fl_lightning.privacy.calibration import calibrate_noise_multiplier, noise_request
from fl_lightning.privacy.central_sum import refuse_relative_bound
from fl_lightning.privacy.dp_fedavg import add_noise, clipped_sum
from fl_lightning.privacy.ledger import Ledger, check_count, check_released
from fl_lightning.privacy.ledger_seal import check_sealed, ledger_key, sealed
from fl_lightning.privacy.noise import check_secure_mode, noise_source, start_noise
from fl_lightning.privacy.mechanism import DPMechanism
from fl_lightning.robust.update_bounds import UpdateBound, positive_finite


class DPFedBuff(DPMechanism, AlgorithmWrapper):
    r"""DP-FedAvg's Gaussian mechanism (McMahan et al. 2018, Algorithm 1) on every buffer of FedBuff
    (Nguyen et al. 2022) or FedStaleWeight.

    Each aggregation keeps at most one update per client (the first to arrive; a fast client's later
    updates in the same buffer are dropped and counted in ``round/dp_repeats_dropped``), clips each
    kept update to L2 norm :math:`C` and releases the buffer's mean with the fixed denominator
    :math:`b` (``buffer_size``),

    .. math:: \bar\Delta = \frac{1}{b}\Big(\sum_j \Delta_j \min(1, C/\lVert\Delta_j\rVert) + \mathcal N(0, z^2C^2 I)\Big),

    whose sensitivity is :math:`C/b` whoever arrived. The wrapped algorithm's step applies it as
    :math:`\eta_g (\sum_j \alpha_j)\,\bar\Delta` (:meth:`FedBuff.aggregate_with`): the weights
    :math:`\alpha_j` depend only on staleness, which the server's clock sets, not on the data.
    Integer buffers are not released. Noise comes from a secret with ``secure_mode`` (see
    :class:`~fl_lightning.privacy.DPFedAvg`), else from ``(seed, "dp_noise", version)`` with a warning.

    Neighbouring relation: *zero-out* adjacency (a neighbouring run has one user's updates replaced by
    zero updates; who arrives when is the same in both runs, since the virtual clock, not the data,
    sets it). Add/remove-one would change the arrivals, hence every buffer, and is not covered; under
    replace-one the sum moves by :math:`2C` and ε would be that of multiplier :math:`z/2`. A non-finite
    update — NaN/Inf values or a NaN/Inf training loss — is aggregated as a zero update
    (:meth:`replace_non_finite`, which the loop's guard calls instead of dropping it), its neighbour under zero-out, with
    its weight :math:`\alpha_j`: dropping it would shorten the buffer's step
    :math:`\eta_g \sum_j \alpha_j`, or leave a buffer empty and release nothing, both data-dependent.

    Accounting: under zero-out adjacency one user changes at most one clipped update of an
    aggregation by at most :math:`C`, so each aggregation is a Gaussian mechanism of multiplier
    :math:`z`. Arrivals are not sampled (every client is in flight and arrives when its job ends),
    so no amplification applies: ε at ``delta`` after
    :math:`T` aggregations is that of :math:`T` composed Gaussian mechanisms (RDP, ``dp-accounting``),
    logged every aggregation as ``round/dp_epsilon`` — a bound for a client in every buffer; it composes
    what was released, so a run resumed with another ``noise_multiplier`` keeps the aggregations spent
    at the old one. With
    ``target_epsilon`` no aggregation that would take ε past it runs: the run stops after the last
    affordable one, and a resumed run whose budget is spent stops before its first.

    Args:
        noise_multiplier: :math:`z \ge 0`; 0 adds no noise (ε = ∞). ``None`` (with ``target_epsilon``): the
            smallest :math:`z` whose ε over ``max_epochs`` aggregations is at most ``target_epsilon``, found at
            set-up (:mod:`~fl_lightning.privacy.calibration`) and logged.
        clip_norm: :math:`C > 0`.
        delta: :math:`\delta \in (0, 1)` at which ε is reported.
        target_epsilon: the ε budget (> 0); ``None`` runs for ``max_epochs`` aggregations.
        secure_mode: draw the noise from a secret instead of the run's seed.
        log_client_statistics: also log the unnoised client statistics (as :class:`~fl_lightning.DPFedAvg`).
        algorithm: a :class:`~fl_lightning.FedBuff` or :class:`~fl_lightning.FedStaleWeight`.

    Refused: an ``update_bound`` whose effect on one client depends on the others'
    (:class:`~fl_lightning.MedianNormFilter`); a wrapper around it that reads unnoised client values.
    """

    summary_metrics: ClassVar[dict[str, str]] = {"round/dp_epsilon": "final"}
    neighbouring_relation = "zero-out"

    def __init__(
        self,
        *,
        noise_multiplier: float | None = None,
        clip_norm: float,
        delta: float = 1e-5,
        target_epsilon: float | None = None,
        secure_mode: bool = False,
        log_client_statistics: bool = False,
        algorithm: Algorithm,
    ) -> None:
        #: :math:`z`; with ``noise_multiplier=None``, calibrated at set-up to ``target_epsilon`` over the run's rounds.
        self.noise_multiplier, self.target_epsilon = noise_request("DPFedBuff", noise_multiplier, target_epsilon)
        self._calibrates = noise_multiplier is None
        self.log_client_statistics = check_bool("log_client_statistics", log_client_statistics)
        self.clip_norm = positive_finite("clip_norm", clip_norm)
        self.delta = check_delta(delta)
        self.secure_mode = check_secure_mode(secure_mode)
        if not isinstance(algorithm, FedBuff):
            raise ValueError(
                f"DPFedBuff noises the mean of an asynchronous buffer: it wraps FedBuff or FedStaleWeight, got "
                f"{type(algorithm).__name__} (use DPFedAvg for synchronous rounds)."
            )
        super().__init__(algorithm)
        #: The aggregations released so far, per noise multiplier.
        self.spent = Ledger()
        self._secret: bytes | None = None
        self._ledger_key: bytes | None = None
        if not self._calibrates and self.target_epsilon is not None and self.epsilon(1) > self.target_epsilon:
            raise ValueError(
                f"One aggregation already spends epsilon={self.epsilon(1):.4g} > target_epsilon={self.target_epsilon}: "
                "raise noise_multiplier or target_epsilon."
            )

    @override
    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        if self._calibrates:
            self.noise_multiplier = self._calibrated(federation.num_rounds)
        self._secret = start_noise("DPFedBuff", self.secure_mode)
        self._ledger_key = ledger_key() if self.secure_mode else None

    def _calibrated(self, aggregations: int | None) -> float:
        """The smallest :math:`z` whose ε over ``aggregations`` Gaussian releases is at most ``target_epsilon``."""
        if aggregations is None:
            raise ValueError("DPFedBuff(noise_multiplier=None) calibrates over the run's aggregations: set max_epochs.")
        what = f"{aggregations} aggregations"
        z = calibrate_noise_multiplier(
            lambda z: composed_gaussian_epsilon((((z,), aggregations),), self.delta),
            self.target_epsilon,  # type: ignore[arg-type]
            what,
        )
        rank_zero_info(
            f"DPFedBuff: noise_multiplier={z:.4g}, the smallest with epsilon <= {self.target_epsilon} at delta={self.delta:g} over {what}."
        )
        return z

    @override
    def check_update_bound(self, bound: UpdateBound) -> None:
        refuse_relative_bound("DPFedBuff", bound)
        super().check_update_bound(bound)

    @override
    def replace_non_finite(self, update: ClientUpdate) -> ClientUpdate:
        """A zero update in place of a non-finite one (NaN/Inf values or training loss): the loop would drop it,
        changing the buffer's count and step with the client's data. Its training loss is not carried over."""
        metrics = {k: v for k, v in update.metrics.items() if k != "train_loss"}
        return replace(update, payload={name: torch.zeros_like(t) for name, t in update.payload.items()}, metrics=metrics)

    @property
    def aggregations(self) -> int:
        """Aggregations released so far, at every noise multiplier."""
        return self.spent.total

    def epsilon(self, more: int = 0) -> float:
        """ε at ``delta`` of the aggregations released so far and ``more`` at the current multiplier :math:`z`."""
        return composed_gaussian_epsilon(self.spent.with_more((self.noise_multiplier,), more), self.delta)

    @property
    def budget_left(self) -> bool:
        """Whether one more aggregation keeps ε within ``target_epsilon``."""
        return self.target_epsilon is None or self.epsilon(1) <= self.target_epsilon

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        first = {}
        for update in updates:
            first.setdefault(update.client_id, update)
        kept = list(first.values())
        assert isinstance(self.inner, FedBuff)
        metrics = self.inner.aggregate_with(round_idx, global_state, kept, lambda payloads: self.release(round_idx, payloads))
        self.spent.spend((self.noise_multiplier,))
        epsilon = self.epsilon()
        if not self.budget_left:
            rank_zero_warn(
                f"Aggregation {round_idx}: epsilon={epsilon:.4g}; one more would exceed "
                f"target_epsilon={self.target_epsilon}, so training stops."
            )
            self.federation.services.request_stop()
        noise_std = self.noise_multiplier * self.clip_norm
        return {
            **metrics,
            "dp_epsilon": epsilon,
            "dp_noise_std": noise_std,
            "dp_repeats_dropped": float(len(updates) - len(kept)),
        }

    def release(self, version: int, payloads: list[State]) -> State:
        """The noised mean :math:`\\bar\\Delta` of the clipped ``payloads`` over ``buffer_size``."""
        total, _ = clipped_sum(payloads, self.clip_norm)
        released = [name for name, value in payloads[0].items() if value.is_floating_point()]
        source = noise_source(self._secret, self.federation.seed, "dp_noise", version)
        add_noise(total, released, self.noise_multiplier * self.clip_norm, source)
        b = self.inner.buffer_size  # type: ignore[attr-defined]
        return {name: t / b for name, t in total.items()}

    @override
    def state_dict(self) -> dict[str, Any]:
        """The wrapped algorithm's state and the ledger; in secure mode with its HMAC (:mod:`~fl_lightning.privacy.ledger_seal`)."""
        return sealed({**super().state_dict(), "spent": self.spent.state_dict()}, self._ledger_key, ("spent",))

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the ledger, checked (a tampered entry raises ValueError naming it); a checkpoint from
        before the ledger holds ``aggregations`` only, accounted at the current noise multiplier. In secure mode
        a ledger whose HMAC does not verify is refused."""
        check_sealed(state, self._ledger_key, ("spent",))
        super().load_state_dict(state)
        if "spent" in state:
            self.spent = Ledger.from_state(state["spent"], "spent", width=1)
        else:
            count = check_count("aggregations", state["aggregations"])
            self.spent = Ledger((((self.noise_multiplier,), count),) if count else ())
        if not self.budget_left and hasattr(self, "federation"):  # a resumed run that spent its budget releases nothing more
            self.federation.services.request_stop()

    @override
    def check_restored(self, rounds_done: int) -> None:
        """At most one release per aggregation done."""
        super().check_restored(rounds_done)
        check_released(self.spent.total, rounds_done)
