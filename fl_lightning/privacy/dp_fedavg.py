"""Central, user-level differential privacy over a weighted-sum algorithm (DP-FedAvg)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from fl_lightning.privacy.ledger_seal import check_sealed, ledger_key, sealed
from fl_lightning.algorithms.shared.aggregation import accumulator_dtype, weighted_sum
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientUpdate
from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.algorithms.shared.summable import aggregate_weighted_sum, can_shard
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper, wrapped
from fl_lightning.data._data_checks import check_bool
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State
from fl_lightning.privacy.accountant import Accounting, RoundAccountant, Sampling, check_accounting, check_delta
from fl_lightning.privacy.adaptive_clipping import AdaptiveClipping
from fl_lightning.privacy.calibration import calibrate_noise_multiplier, noise_request
from fl_lightning.privacy.ledger import Entries, Ledger, check_count, check_released
from fl_lightning.privacy.release_log import ReleaseLog
from fl_lightning.privacy.noise import NoiseSource, check_secure_mode, noise_source, start_noise
from fl_lightning.privacy.central_sum import CentralSumMechanism
from fl_lightning.robust.update_bounds import positive_finite, update_norm


#: What a secure-mode checkpoint authenticates (:mod:`~fl_lightning.privacy.ledger_seal`): the ledger and the settings it
#: was spent at (the release log it names must extend that ledger, :class:`ReleaseLog`).
_SEALED = ("spent", "clip_norm", "sampling")


class DPFedAvg(CentralSumMechanism):
    r"""DP-FedAvg (McMahan et al. 2018, "Learning Differentially Private Recurrent Language Models",
    Algorithm 1) around any synchronous weighted-sum algorithm (FedAvg, FedProx, their server optimizers).

    Each round, every client's delta is clipped to L2 norm :math:`C`,
    :math:`\hat\Delta_k = \Delta_k \min(1, C / \lVert\Delta_k\rVert)`, and the server releases

    .. math:: \Delta_t = \frac{1}{m}\Big(\sum_k \hat\Delta_k + \mathcal N(0, z^2 C^2 I)\Big),

    the *fixed-denominator* estimator :math:`\tilde f_f` of McMahan et al. 2018 (§2, Algorithm 1,
    :math:`\sum_k w_k\Delta_k / (qW)` with weights :math:`w_k = 1`, so :math:`qW = m`, the configured
    ``clients_per_round``): the denominator never depends on who took part, so one client moves the
    clipped sum by at most :math:`C` (added or removed) or :math:`2C` (replaced). The wrapped algorithm
    then applies :math:`\Delta_t` (``apply_weighted_sum`` with weight :math:`m`: its server optimizer,
    FedProx's client term). Its client weighting is replaced by
    these uniform weights; integer buffers (BatchNorm's ``num_batches_tracked``) are not released.

    What is released: the shared tensors only (``federated_parameters``): a frozen base (LoRA, a frozen
    backbone) is never clipped, noised or moved, and a client's local tensors (FedBN's BatchNorm, FedPer's head)
    never leave it. The clip norm :math:`C` bounds the shared delta's norm, so the noise scales with the
    adapter, not the base.

    Clients are sampled uniformly (``sampling="fixed"``: ``clients_per_round`` without replacement)
    or independently with probability :math:`q = m / N` (``"poisson"``), as the accountant
    (:class:`~fl_lightning.privacy.RoundAccountant`, Google's ``dp-accounting``; by default the PLD of
    each sampling's dominating pair, :mod:`fl_lightning.privacy.pld`) assumes; ε at
    ``delta`` is logged every round as ``round/dp_epsilon``. With ``target_epsilon`` no round
    that would take ε past it runs: the trainer stops (``trainer.should_stop``) after the last
    affordable round.

    Neighbouring relation: with ``sampling="fixed"``, replace-one (one client's data swapped for
    another's moves the clipped sum by up to :math:`2C`, accounted as multiplier :math:`z/2`); with
    ``"poisson"``, add/remove-one (sensitivity :math:`C`). ε composes what was released
    (:class:`~fl_lightning.privacy.ledger.Ledger`): a run resumed with another ``noise_multiplier``
    or federation size keeps the rounds spent at the old setting. A round in which no update survives
    the loop's checks still releases the noise and spends budget, so whether a client's update was
    usable is not revealed.

    Noise and sample: with ``secure_mode`` both come from a secret no logged or saved value determines
    (:mod:`fl_lightning.privacy.noise`): the fixed-size sample is the :math:`m` clients with the smallest of
    :math:`N` secret uniforms, Poisson membership a secret uniform below :math:`q`; the round's client ids are
    not checkpointed (``secret_sample``), and per-client state, which would name them, is refused. A resumed
    run draws a new secret, so its noise and samples differ from an uninterrupted run's (the checkpoint's
    weights, ledger and clip norm resume bit-exact); every release is first recorded in a release log beside
    the checkpoints (:mod:`fl_lightning.privacy.release_log`), so a run resumed from an older checkpoint
    accounts the rounds it released after it. Without it (research mode, with a warning) noise and sample
    derive from ``(seed, "dp_noise", round)`` and ``(seed, "select", round)``, reproducible and bit-exact on
    resume, but whoever knows the logged seed can strip the noise and knows the sample. Under client sharding each rank
    clips and sums its own clients; the noise is drawn once after the all-reduce, the same draw on
    every rank (secure mode broadcasts rank 0's secret at set-up), so N processes release what one does.

    Refused: an ``update_bound`` whose effect on one client depends on the others'
    (:class:`~fl_lightning.MedianNormFilter`: the sensitivity would no longer be :math:`C`); a wrapped
    algorithm that selects its own clients (FedALIGN: its sample and loss admission bypass the accounted
    sampling); a wrapper around it that reads unnoised client values (``FedALIGN(algorithm=DPFedAvg(...))``,
    :meth:`~fl_lightning.Algorithm.unnoised_client_values`). A wrapped algorithm's sample-count weighting
    is no such read: the uniform weights above replace it.

    Logs: ε, the clip norm and the noise std each round; the round's unnoised client statistics (mean
    training loss, client counts, upload bytes: :data:`~fl_lightning.loops.round_log.CLIENT_STATISTICS`)
    only with ``log_client_statistics=True``. The progress line and the fit summary state ε at δ, the
    accountant and the neighbouring relation (:meth:`privacy_statement`).

    Args:
        noise_multiplier: :math:`z \ge 0`; 0 adds no noise (ε = ∞). ``None`` (with ``target_epsilon``): the
            smallest :math:`z` whose ε over the run's ``max_epochs`` rounds is at most ``target_epsilon``, found at
            set-up with the chosen accountant (:mod:`~fl_lightning.privacy.calibration`) and logged.
        clip_norm: :math:`C > 0` (the initial value with ``adaptive_clipping``); ``math.inf`` only
            without noise.
        delta: :math:`\delta \in (0, 1)` at which ε is reported.
        target_epsilon: the ε budget (> 0): no round that would pass it runs; ``None`` trains for ``max_epochs``
            rounds.
        sampling: ``"fixed"`` or ``"poisson"``.
        adaptive_clipping: adapts :math:`C` to a quantile of the update norms (Andrew et al. 2021).
        secure_mode: draw the noise and the client sample from a secret instead of the run's seed.
        accounting: ``"pld"`` (privacy loss distributions, the tightest) or ``"rdp"`` (Rényi DP).
        log_client_statistics: also log the round's unnoised client statistics, which the guarantee does not
            cover (``docs/privacy_robustness.md``, threat model).
        algorithm: the wrapped algorithm (default ``FedAvg(weighting="uniform")``); it must sum its
            clients' deltas (:class:`~fl_lightning.SummableAggregation`), or average its decoded deltas
            (FedMRN: each decoded masked-noise update :math:`G(s_k)\odot m_k` is what is clipped; no
            sharding then), and use the default uniform client selection.
    """

    summary_metrics: ClassVar[dict[str, str]] = {"round/dp_epsilon": "final"}

    accountant: RoundAccountant

    def __init__(
        self,
        *,
        noise_multiplier: float | None = None,
        clip_norm: float = 1.0,
        delta: float = 1e-5,
        target_epsilon: float | None = None,
        sampling: Sampling = "fixed",
        adaptive_clipping: AdaptiveClipping | None = None,
        secure_mode: bool = False,
        accounting: Accounting = "pld",
        log_client_statistics: bool = False,
        algorithm: Algorithm | None = None,
    ) -> None:
        #: :math:`z`; with ``noise_multiplier=None``, calibrated at set-up to ``target_epsilon`` over the run's rounds.
        self.noise_multiplier, self.target_epsilon = noise_request("DPFedAvg", noise_multiplier, target_epsilon)
        self._calibrates = noise_multiplier is None
        self.log_client_statistics = check_bool("log_client_statistics", log_client_statistics)
        if not (noise_multiplier == 0 and adaptive_clipping is None and clip_norm == math.inf):
            positive_finite("clip_norm", clip_norm)
        self.clip_norm = float(clip_norm)
        self.delta = check_delta(delta)
        if sampling not in ("fixed", "poisson"):
            raise ValueError(f"`sampling` must be 'fixed' or 'poisson', got {sampling!r}.")
        self.sampling = sampling
        self.adaptive_clipping = adaptive_clipping
        self.secure_mode = check_secure_mode(secure_mode)
        self.accounting = check_accounting(accounting)
        super().__init__(algorithm if algorithm is not None else FedAvg(weighting="uniform"))
        self._check_inner(self.inner)
        #: The rounds released so far, per setting :math:`(z, N, m)`.
        self.spent = Ledger()
        self._secret: bytes | None = None
        self._ledger_key: bytes | None = None
        self._release_log = ReleaseLog(None)

    def _round_accountant(self, federation: Federation, noise_multiplier: float) -> RoundAccountant:
        """The accountant of this mechanism's rounds on ``federation`` at multiplier ``noise_multiplier``."""
        return RoundAccountant(
            noise_multiplier=noise_multiplier,
            num_clients=federation.num_clients,
            clients_per_round=federation.clients_per_round,
            sampling=self.sampling,
            delta=self.delta,
            accounting=self.accounting,
        )

    def _calibrated(self, federation: Federation) -> float:
        """The smallest :math:`z` whose ε over the run's rounds (``max_epochs``) is at most ``target_epsilon``."""
        rounds = federation.num_rounds
        if rounds is None:
            raise ValueError(
                "DPFedAvg(noise_multiplier=None) calibrates to target_epsilon over the run's rounds: set max_epochs."
            )

        def epsilon_of(z: float) -> float:
            return self._round_accountant(federation, z).epsilon(rounds)

        what = f"{rounds} rounds of {federation.clients_per_round} of {federation.num_clients} clients ({self.sampling} sampling)"
        z = calibrate_noise_multiplier(epsilon_of, self.target_epsilon, what)  # type: ignore[arg-type]
        rank_zero_info(
            f"DPFedAvg: noise_multiplier={z:.4g}, the smallest with epsilon <= {self.target_epsilon} at delta={self.delta:g} over {what}."
        )
        return z

    @property
    def rounds_spent(self) -> int:
        """Rounds released so far, at every setting."""
        return self.spent.total

    @staticmethod
    def _check_inner(inner: Algorithm) -> None:
        name = type(inner).__name__
        if not inner.uploads_deltas:
            raise ValueError(
                f"DPFedAvg clips client deltas, but {name}'s uploads are not deltas (a whole model, or masks sampled "
                "from one): clipping them would not bound a client's influence on what is released; FedSoft also "
                "selects clients by their unnoised importance estimates, which no noise on the centres covers."
            )
        if not can_shard(inner):
            raise ValueError(
                f"DPFedAvg needs a synchronous algorithm whose aggregation is a sum of client deltas "
                f"(SummableAggregation: FedAvg, FedProx, their server optimizers) or a compressed FedAvg that "
                f"averages decoded deltas (FedMRN's masked noise, FedAvgSM); {name} is not."
            )
        forwarding = (Algorithm.select_clients, AlgorithmWrapper.select_clients)
        selecting = next((layer for layer in wrapped(inner) if type(layer).select_clients not in forwarding), None)
        if selecting is not None:
            raise ValueError(
                f"DPFedAvg's accounting assumes uniform client sampling, but {type(selecting).__name__} selects its own "
                f"clients: DPFedAvg and {type(selecting).__name__} cannot be combined."
            )

    @override
    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        if self._calibrates:
            self.noise_multiplier = self._calibrated(federation)
        self.accountant = self._round_accountant(federation, self.noise_multiplier)
        if self.adaptive_clipping is not None:  # checks 2 sigma_b > z now rather than in round 0
            self.adaptive_clipping.update_noise_multiplier(self.noise_multiplier, federation.clients_per_round)
        if self.target_epsilon is not None and self.accountant.epsilon(1) > self.target_epsilon:
            raise ValueError(
                f"One round already spends epsilon={self.accountant.epsilon(1):.4g} > target_epsilon={self.target_epsilon}: "
                "raise noise_multiplier or target_epsilon, or lower clients_per_round."
            )
        self._secret = start_noise("DPFedAvg", self.secure_mode, " and client sample")
        self._ledger_key = ledger_key() if self.secure_mode else None
        if self.secure_mode:
            self._release_log = ReleaseLog.fresh(federation.services.run_folder())

    @property
    def neighbouring_relation(self) -> str:  # type: ignore[override]
        """Add/remove-one under Poisson sampling, replace-one under fixed-size sampling."""
        return "add/remove-one" if self.sampling == "poisson" else "replace-one"

    @property
    def accountant_name(self) -> str:  # type: ignore[override]
        """``PLD`` or ``RDP``, as ``accounting`` chose."""
        return self.accounting.upper()

    @property
    @override
    def secret_sample(self) -> bool:
        """In secure mode: the sample comes from the secret, so no id of it may be saved."""
        return self.secure_mode

    @property
    def budget_left(self) -> bool:
        """Whether one more round keeps ε within ``target_epsilon``."""
        return self.target_epsilon is None or self.epsilon(self.spent.with_more(self.accountant.setting)) <= self.target_epsilon

    def epsilon(self, entries: Entries | None = None) -> float:
        """ε at ``delta`` of the ledger ``entries`` (default: the rounds released so far)."""
        return self.accountant.spent_epsilon(tuple(self.spent.entries) if entries is None else entries)

    @override
    def select_clients(self, round_idx: int) -> list[int]:
        """Uniform sampling as accounted for, from the secret in secure mode; no client once the budget is
        spent (nothing is released)."""
        if not self.budget_left:
            self.federation.services.request_stop()
            return []
        if self.sampling == "fixed" and self._secret is None:
            return super().select_clients(round_idx)
        fed = self.federation
        draws = noise_source(self._secret, fed.seed, "select", round_idx).uniform(fed.num_clients)
        if self.sampling == "fixed":  # the m smallest of N i.i.d. uniforms: a uniform m-subset
            return sorted(torch.argsort(draws)[: fed.clients_per_round].tolist())
        return torch.nonzero(draws < fed.clients_per_round / fed.num_clients).flatten().tolist()

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        if not updates:  # nothing survived: release the noise on an empty sum all the same
            return self.apply_weighted_sum(round_idx, global_state, zero_sum(global_state), 0.0)
        return aggregate_weighted_sum(self, round_idx, global_state, updates)

    @override
    def weighted_delta_sum(self, updates: list[ClientUpdate]) -> tuple[State, float]:
        r""":math:`(\sum_k \hat\Delta_k, \sum_k (b_k - \frac12))`: the clipped deltas' sum (integer tensors
        zeroed) and the centred count of updates that fit unclipped, :math:`b_k = \mathbb 1[\lVert\Delta_k\rVert
        \le C]`, the one per-client scalar the server step reads (Andrew et al. 2021's clipped count, §3)."""
        total, unclipped = clipped_sum([u.payload for u in updates], self.clip_norm)
        return total, unclipped - len(updates) / 2

    @override
    def apply_weighted_sum(self, round_idx: int, global_state: State, total: State, weight: float) -> dict[str, float]:
        """Adds the round's seeded Gaussian noise to the clipped sum ``total`` and lets the wrapped algorithm
        apply its mean over the expected clients; ``weight`` is the centred unclipped count (:meth:`weighted_delta_sum`).
        Nothing is released once the budget is spent (a resumed run's round selects no client, and would else
        still release noise)."""
        if not self.budget_left:
            return {}
        clip_norm, expected = self.clip_norm, float(self.federation.clients_per_round)
        multiplier = self.update_noise_multiplier()
        noise_std = multiplier * clip_norm if multiplier > 0 else 0.0  # no noise stays 0 with C = inf
        released = [name for name, target in global_state.items() if target.is_floating_point()]  # the same draws on every rank
        seed = self.federation.seed
        add_noise(total, released, noise_std, noise_source(self._secret, seed, "dp_noise", round_idx))
        self.spent.spend(self.accountant.setting)
        self._release_log.record(self.spent)  # durable before the model moves: a resume cannot forget it
        metrics = self.inner.apply_weighted_sum(round_idx, global_state, total, expected)
        metrics.update(dp_epsilon=self.epsilon(), dp_clip_norm=clip_norm, dp_noise_std=noise_std)
        if self.adaptive_clipping is not None:
            count_noise = noise_source(self._secret, seed, "dp_count_noise", round_idx)
            self.clip_norm, metrics["dp_unclipped_fraction"] = self.adaptive_clipping.next_clip_norm(
                clip_norm, weight, expected, count_noise
            )
        if not self.budget_left:
            rank_zero_warn(
                f"Round {round_idx}: epsilon={metrics['dp_epsilon']:.4g}; one more round would exceed "
                f"target_epsilon={self.target_epsilon}, so training stops."
            )
            self.federation.services.request_stop()
        return metrics

    def update_noise_multiplier(self) -> float:
        """The noise multiplier on the update: :math:`z`, or :math:`z_\\Delta` with adaptive clipping."""
        if self.adaptive_clipping is None:
            return self.noise_multiplier
        return self.adaptive_clipping.update_noise_multiplier(self.noise_multiplier, self.federation.clients_per_round)

    @override
    def state_dict(self) -> dict[str, Any]:
        """The wrapped algorithm's state, the clip norm, the sampling and the ledger; in secure mode also the release
        log's path and the HMAC of the ledger and the settings it was spent at (``spent_seal``,
        :mod:`~fl_lightning.privacy.ledger_seal`)."""
        state = {**super().state_dict(), "clip_norm": self.clip_norm, "sampling": self.sampling, "spent": self.spent.state_dict()}
        if self._release_log.path is not None:
            state["release_log"] = self._release_log.path
        return sealed(state, self._ledger_key, _SEALED)

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the clip norm and the ledger, each checked (a tampered entry raises ValueError naming it; in
        secure mode, a ledger whose HMAC does not verify); a checkpoint from before the ledger holds ``rounds_spent``
        only, accounted at the current setting. In secure mode the ledger is then the checkpoint's release log's
        (:meth:`ReleaseLog.resume`): every release of the run, those after this checkpoint included. Without
        adaptive clipping the clip norm never changes: the configured one stays, whatever the state holds."""
        check_sealed(state, self._ledger_key, _SEALED)
        super().load_state_dict(state)
        clip_norm = state["clip_norm"]
        if isinstance(clip_norm, bool) or not isinstance(clip_norm, (int, float)) or not clip_norm > 0:
            raise ValueError(f"`clip_norm` must be a number > 0 (math.inf only without noise), got {clip_norm!r}.")
        if clip_norm == math.inf and self.noise_multiplier > 0:
            raise ValueError(f"`clip_norm` must be finite when noise is added, got {clip_norm!r}.")
        if state.get("sampling", self.sampling) != self.sampling:
            raise ValueError(
                f"`sampling` was {state['sampling']!r} and is now {self.sampling!r}: rounds of either cannot be composed "
                "under one neighbouring relation; resume with the checkpoint's sampling."
            )
        if "spent" in state:
            self.spent = Ledger.from_state(state["spent"], "spent", width=3)
        else:
            rounds = check_count("rounds_spent", state["rounds_spent"])
            self.spent = Ledger(((self.accountant.setting, rounds),) if rounds else ())
        if self.secure_mode and "release_log" in state:
            if not isinstance(state["release_log"], str):
                raise ValueError(f"`release_log` must be the path of the run's release log, got {state['release_log']!r}.")
            self._release_log = ReleaseLog(state["release_log"])
            self.spent = self._release_log.resume(self.spent)
        if self.adaptive_clipping is not None:
            self.clip_norm = float(clip_norm)

    @override
    def check_restored(self, rounds_done: int) -> None:
        """In research mode the ledger records at most one release per round done (fewer where a round was rolled
        back, or released nothing once the budget was spent: a re-run round repeats its release). In secure mode a
        re-run round is a new release, so the ledger (the release log's) may hold more; its seal protects it."""
        super().check_restored(rounds_done)
        if not self.secure_mode:
            check_released(self.spent.total, rounds_done)


def clipped_sum(payloads: list[State], clip_norm: float) -> tuple[State, int]:
    r""":math:`\sum_k \Delta_k \min(1, C/\lVert\Delta_k\rVert)` (integer tensors zeroed: not released) and the
    number of payloads that fit unclipped, :math:`\sum_k \mathbb 1[\lVert\Delta_k\rVert \le C]`."""
    norms = [update_norm(p) for p in payloads]
    total = weighted_sum(payloads, [min(1.0, clip_norm / norm) if norm > 0 else 1.0 for norm in norms])
    for name, value in payloads[0].items():
        if not value.is_floating_point():
            total[name].zero_()
    return total, sum(norm <= clip_norm for norm in norms)


def add_noise(total: State, names: list[str], std: float, source: NoiseSource, sign: float = 1.0) -> None:
    r"""Adds ``sign`` times :math:`\mathcal N(0, \mathrm{std}^2)` to ``total[name]`` in place, for the ``names`` it
    holds, in their order (so the draws are reproducible, and subtracting the same source's draws cancels them);
    nothing when ``std`` is 0."""
    for name in names:
        if std > 0 and name in total:
            total[name].add_(source.normal(total[name].shape).mul_(std).to(total[name]), alpha=sign)


def zero_sum(global_state: State) -> State:
    """The clipped sum of no update: zeros of the accumulator's dtype for every tensor of ``global_state``."""
    return {name: torch.zeros_like(t, dtype=accumulator_dtype(t.dtype)) for name, t in global_state.items()}
