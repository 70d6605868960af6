"""FedALIGN (Ravi & Shomorony, "Utilizing Free Clients in Federated Learning for Focused Model
Enhancement"): prioritized FL that admits only non-priority clients whose loss is close to the
priority loss, with the priority-only and all-clients baselines."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import lightning.pytorch as pl
import numpy as np
import torch
from typing_extensions import override

from fl_lightning.algorithms.shared.algorithm import Algorithm
from fl_lightning.algorithms.shared.epsilon_schedules import ConstantEpsilon, EpsilonSchedule, check_epsilon
from fl_lightning.algorithms.local_only import check_client_ids, holdout_metrics
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper
from fl_lightning.server.federation import Federation
from fl_lightning.evaluation.probe import probe, sample_metrics
from fl_lightning.utils.checks import check_integer


@dataclass(frozen=True)
class Decision:
    """A non-priority client's opt-in (client side) and acceptance (server side)."""

    opted_in: bool
    accepted: bool


def alignment_decision(client_loss: float, global_loss: float, epsilon: float, *, strict: bool, two_sided: bool) -> Decision:
    r"""FedALIGN's rule (§3.1): the client opts in if :math:`F_k(w_t) \le F(w_t) + \epsilon_t`; the
    server accepts if also :math:`F(w_t) - \epsilon_t \le F_k(w_t)` (``two_sided``, i.e.
    :math:`|F - F_k| \le \epsilon_t`), or on opt-in alone. ``strict`` uses ``<`` as in the theory's
    indicator (eq. 9), so :math:`\epsilon = 0` admits nobody. The bounds are written as sums,
    not differences, so a loss exactly at :math:`F \pm \epsilon` is decided by ``strict`` alone.

    >>> alignment_decision(0.7, 1.0, 0.2, strict=False, two_sided=True)
    Decision(opted_in=True, accepted=False)
    """
    below = (lambda a, b: a < b) if strict else (lambda a, b: a <= b)
    opted_in = below(client_loss, global_loss + epsilon)
    return Decision(opted_in=opted_in, accepted=opted_in and (not two_sided or below(global_loss - epsilon, client_loss)))


class FedALIGN(AlgorithmWrapper):
    r"""Prioritized FL: the objective is :math:`F = \sum_{k \in P} p_k F_k` with
    :math:`p_k = D_k / D_P` (eq. 5); each round the priority clients train, and a non-priority
    client trains only if its loss on the broadcast model is within :math:`\epsilon_t` of
    :math:`F(w_t)` (:func:`alignment_decision`). The included set is aggregated by the wrapped
    algorithm, sample-count weighted (App. A.1, eq. 14–15): FedAvg by default, or
    ``FedProx(mu=1)`` as in App. C.2. Every client-side and aggregation hook, and the weighted-sum
    protocol, is the wrapped algorithm's (:class:`~fl_lightning.algorithms.shared.wrapper.AlgorithmWrapper`):
    the selection is computed identically on every rank, so FedALIGN shards over processes
    whenever the wrapped aggregation does (``docs/distributed.md``).

    :math:`F(w_t)` is measured as the paper's objective defines it: every sampled priority client
    probes the broadcast model on its training data (no gradient step) and the server weights
    the losses by :math:`p_k` (the paper leaves the source of the "global loss" open). With
    ``clients_per_round`` < all (App. C.3), a uniform sample of all clients is drawn first and
    the rule applies to its non-priority members; a round whose sample has no priority client
    admits no non-priority client. During the first ``ceil(warmup_fraction * rounds)`` rounds
    only priority clients train (paper: 10%).

    Each round logs ``round/priority_loss`` (:math:`F(w_t)`), ``round/epsilon``,
    ``round/accepted_nonpriority``, ``round/theta`` (:math:`1/(1+\sum_{accepted} p_k)`), and, for
    the new global model, ``round/priority_test_acc``/``round/priority_test_loss``: test accuracy
    and loss per class weighted by the priority clients' class proportions (a per-round test
    curve, not for model selection). The module's validation metrics stay on the server's whole
    validation set. With ``evaluate_clients``, also ``round/local_test_acc`` /
    ``round/local_test_loss``: the global model on those clients' own held-out samples, the metric
    of App. C.1 that :class:`~fl_lightning.algorithms.LocalOnly` reports for their local models.

    Args:
        priority: priority client ids, or a count (the first ``n`` ids), or ``None`` to read
            ``priority_clients`` from the data module or its training set.
        epsilon: :math:`\epsilon` or a schedule (:mod:`~fl_lightning.algorithms.shared.epsilon_schedules`).
        algorithm: the aggregation algorithm wrapped (default :class:`FedAvg`).
        warmup_fraction: fraction of rounds in ``[0, 1)`` with priority clients only.
        strict: ``<`` instead of ``<=``.
        two_sided: server-side acceptance :math:`|F - F_k| \le \epsilon`; else opt-in suffices.
        metric: ``"loss"`` (default) or ``"accuracy"`` (compares error rates :math:`1 - acc`).
        evaluate_priority: log the priority-weighted **test** metrics each round (the paper's
            curves). Off by default: ``fit`` reads the test set only when asked to, and these are
            reports, never for model selection (``docs/evaluation.md``).
        evaluate_clients: client ids whose held-out data also score the global model (App. C.1:
            the non-priority clients); needs ``holdout_fraction > 0``. ``None``: not logged.
    """

    summary_metrics: ClassVar[dict[str, str]] = {
        "round/priority_test_acc": "final",
        "round/accepted_nonpriority": "mean",
    }

    def __init__(
        self,
        *,
        priority: Sequence[int] | int | None = None,
        epsilon: float | EpsilonSchedule = 0.2,
        algorithm: Algorithm | None = None,
        warmup_fraction: float = 0.1,
        strict: bool = False,
        two_sided: bool = True,
        metric: str = "loss",
        evaluate_priority: bool = False,
        evaluate_clients: Sequence[int] | None = None,
    ) -> None:
        if not 0 <= warmup_fraction < 1:
            raise ValueError(f"`warmup_fraction` must be in [0, 1), got {warmup_fraction}.")
        if metric not in ("loss", "accuracy"):
            raise ValueError(f"`metric` must be 'loss' or 'accuracy', got {metric!r}.")
        if priority is not None and not isinstance(priority, Sequence):  # a count of priority clients
            check_integer("priority", priority, minimum=1)
        self.priority_spec = priority
        if not isinstance(epsilon, EpsilonSchedule):
            check_epsilon("epsilon", epsilon)  # named as the user set it, not as ConstantEpsilon's `value`
            epsilon = ConstantEpsilon(epsilon)
        self.epsilon = epsilon
        super().__init__(algorithm)
        if self.inner.asynchronous:
            raise ValueError(f"{type(self).__name__} selects each round's clients; {type(self.inner).__name__} is asynchronous (no rounds).")
        self.warmup_fraction, self.strict, self.two_sided = warmup_fraction, strict, two_sided
        self.metric, self.evaluate_priority = metric, evaluate_priority
        self.evaluate_clients_spec = None if evaluate_clients is None else list(evaluate_clients)
        #: Accepted non-priority clients of each round.
        self.accepted_history: list[list[int]] = []

    @override
    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        self.priority = self._resolve_priority(federation)
        size = federation.num_samples
        self.p = size / size[self.priority].sum()  # p_k = D_k / D_P for every client (eq. 5)
        if self.warmup_fraction and federation.num_rounds is None:
            raise ValueError("A warm-up fraction needs a finite number of rounds (max_epochs).")
        self.warmup_rounds = math.ceil(self.warmup_fraction * (federation.num_rounds or 0))
        spec = self.evaluate_clients_spec
        self.evaluate_clients = None if spec is None else check_client_ids("evaluate_clients", spec, federation.num_clients)

    @override
    def unnoised_client_values(self) -> str:
        return (
            "the clients' unnoised losses on the broadcast model (round/priority_loss and the admission of non-priority "
            "clients) and draws its own sample of clients, bypassing a DP mechanism's sampling and budget check"
        )

    def _resolve_priority(self, federation: Federation) -> list[int]:
        spec = self.priority_spec
        if spec is None:  # a rule supplied by the data: the data module's, or its training set's
            data = federation.data
            spec = getattr(data, "priority_clients", None) or getattr(getattr(data, "train", None), "priority_clients", None)
            if spec is None:
                raise ValueError("No priority set: pass `priority=` (ids or a count) or use data with `priority_clients`.")
        ids = list(range(spec)) if isinstance(spec, int) else sorted(set(int(c) for c in spec))
        if not ids:
            raise ValueError("The priority set is empty: give at least one priority client.")
        bad = [c for c in ids if not 0 <= c < federation.num_clients]
        if bad:
            raise ValueError(f"Priority client ids {bad} are out of range: ids are 0..{federation.num_clients - 1}.")
        return ids

    def client_groups(self) -> dict[str, list[int]]:
        """``priority`` and ``nonpriority`` client ids, for federated evaluation."""
        priority = set(self.priority)
        others = [c for c in range(self.federation.num_clients) if c not in priority]
        return {"priority": list(self.priority), "nonpriority": others}

    def admits(self, round_idx: int, client_loss: float, global_loss: float) -> bool:
        """Whether a probed non-priority client trains this round (FedALIGN's rule)."""
        decision = alignment_decision(
            client_loss, global_loss, self.epsilon(round_idx), strict=self.strict, two_sided=self.two_sided
        )
        return decision.accepted

    def probes_nonpriority(self) -> bool:
        """Whether :meth:`admits` needs the non-priority clients' losses."""
        return True

    def _badness(self, cid: int) -> float:
        result = probe(self.federation.module, self.federation.probe_batches(cid))
        if self.metric == "loss":
            return result.loss
        if result.accuracy is None:
            raise ValueError("metric='accuracy' needs a module whose sample_metrics reports 'correct'.")
        return 1.0 - result.accuracy

    @override
    def select_clients(self, round_idx: int) -> list[int]:
        sampled = Algorithm.select_clients(self, round_idx)  # a uniform sample, whatever the wrapped selection
        priority = [c for c in sampled if c in set(self.priority)]
        candidates = [c for c in sampled if c not in set(self.priority)]
        global_loss = float("nan")
        if priority:
            weights = self.p[priority]
            global_loss = float(np.dot(weights, [self._badness(c) for c in priority]) / weights.sum())
        accepted: list[int] = []
        if round_idx >= self.warmup_rounds and priority:
            if self.probes_nonpriority():
                accepted = [c for c in candidates if self.admits(round_idx, self._badness(c), global_loss)]
            else:
                accepted = [c for c in candidates if self.admits(round_idx, float("nan"), global_loss)]
        del self.accepted_history[round_idx:]
        self.accepted_history.append(accepted)
        self.federation.services.report_round_metrics({
            "priority_loss": global_loss,
            "epsilon": self.epsilon(round_idx),
            "accepted_nonpriority": float(len(accepted)),
            "theta": float(1.0 / (1.0 + self.p[accepted].sum())),
        })
        return sorted(priority + accepted)

    @override
    def evaluate(self, round_idx: int, module: pl.LightningModule) -> dict[str, float]:
        data = self.federation.data
        local = {} if self.evaluate_clients is None else holdout_metrics(module, data, dict.fromkeys(self.evaluate_clients))
        if not self.evaluate_priority:
            return local
        if getattr(data, "test", None) is None or not hasattr(data, "label_counts"):
            return local
        metrics = sample_metrics(module, data.test_dataloader())
        labels = torch.as_tensor(np.asarray(data.test.targets), device=metrics["loss"].device)
        counts = sum(data.label_counts(c) for c in self.priority)
        proportions = counts / counts.sum()
        result: dict[str, float] = {}
        for key, name in (("correct", "priority_test_acc"), ("loss", "priority_test_loss")):
            if key in metrics:
                per_class = [metrics[key][labels == c].mean().item() if (labels == c).any() else 0.0 for c in range(len(counts))]
                result[name] = float(np.dot(proportions, per_class))
        return {**result, **local}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "accepted_history": [list(a) for a in self.accepted_history]}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.accepted_history = [list(a) for a in state["accepted_history"]]


class PriorityOnly(FedALIGN):
    """Baseline: FedAvg on the priority clients only (FedALIGN with every non-priority client rejected)."""

    def admits(self, round_idx: int, client_loss: float, global_loss: float) -> bool:
        return False

    def probes_nonpriority(self) -> bool:
        return False


class AllClients(FedALIGN):
    """Baseline: FedAvg on every sampled client (after the warm-up, if any), evaluated on the priority objective."""

    def admits(self, round_idx: int, client_loss: float, global_loss: float) -> bool:
        return True

    def probes_nonpriority(self) -> bool:
        return False
