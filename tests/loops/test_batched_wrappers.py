"""The batched executor on the algorithm wrappers (central and local DP, robust rules, Byzantine clients, secure
aggregation, FedALIGN) and on the methods whose configure_client only reads the module or loads the client's own
weights (q-FFL, IFCA, LocalOnly): each equal to the Lightning executor (float64 to 1e-10, float32 to 1e-6) on ragged
clients. What it still refuses, it refuses when the trainer is built, with the algorithm's own reason."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from fl_lightning import (
    IFCA,
    Algorithm,
    FedALIGN,
    FedAsync,
    FedAvg,
    FedBuff,
    FedEM,
    FedPM,
    FedProx,
    FedSoft,
    FedStaleWeight,
    LocalOnly,
    QFedAvg,
)
from fl_lightning.algorithms.shared.algorithm import ClientUpdate
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper
from fl_lightning.loops.batched_executor import configure_client_definer
from fl_lightning.privacy import DPFTRL, DPFedAvg, LocalDP
from fl_lightning.robust import Byzantine, CoordinateMedian, Krum, TrimmedMean
from fl_lightning.robust.attacks import LabelFlip, SignFlip
from fl_lightning.robust.update_bounds import update_norm
from fl_lightning.secure import SecureAggregation
from fl_lightning.secure.masking import decode

from ..quiet import quiet_trainer
from .test_batched_methods import compare, mlp

#: Below most of the clients' delta norms (0.3 to 0.75 here), so that clipping acts.
CLIP = 0.4
#: Every client of the 6 in every round: Krum needs n > 2f + 2 updates.
ALL_CLIENTS = {"clients_per_round": 6}

#: By name: the algorithm's factory and the fit's other settings.
WRAPPERS: dict[str, tuple[Callable[[], Algorithm], dict[str, Any]]] = {
    "dpfedavg-noise": (lambda: DPFedAvg(noise_multiplier=1.0, clip_norm=CLIP), {}),
    "dpfedavg-no-noise": (lambda: DPFedAvg(noise_multiplier=0.0, clip_norm=CLIP), {}),
    "dpftrl": (lambda: DPFTRL(noise_multiplier=1.0, clip_norm=CLIP), {}),
    "localdp": (lambda: LocalDP(noise_multiplier=0.1, clip_norm=CLIP), {}),
    "coordinate-median": (CoordinateMedian, {}),
    "trimmed-mean": (lambda: TrimmedMean(beta=0.25), {}),
    "krum": (lambda: Krum(num_byzantine=1), ALL_CLIENTS),
    "byzantine-sign-flip": (lambda: Byzantine(attack=SignFlip(), fraction=0.4), {}),
    "byzantine-label-flip": (lambda: Byzantine(attack=LabelFlip(num_classes=4), fraction=0.4), {}),
    "fedalign": (lambda: FedALIGN(priority=3, warmup_fraction=0.0, epsilon=0.5), {}),
    "qffl": (lambda: QFedAvg(q=1.0), {}),
    "ifca": (lambda: IFCA(num_clusters=2), {}),
    "local-only": (LocalOnly, {**ALL_CLIENTS, "data": {"holdout_fraction": 0.2}}),
}


@pytest.mark.parametrize("precision", ["64-true", "32-true"])
@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_wrappers_and_read_only_configure_clients_equal_lightnings(wrapper: str, precision: str) -> None:
    """The wrappers' configure_client passes the call on (the executor reads the wrapped algorithm's declarations); their
    clipping, noise (from the client's or the round's seed), attacks and rules run per client after training or on the
    server, on updates equal to float rounding."""
    algorithm, kwargs = WRAPPERS[wrapper]
    ref_log, _ = compare(mlp, precision, algorithm=algorithm, **kwargs)
    if wrapper.startswith("dp"):  # the uploads are the unclipped deltas: the server clips them
        assert any(update_norm(u.payload) > CLIP for u in ref_log.updates.values())


#: SecureAggregation's fixed point: ``fraction_bits`` and ``modulus_bits``.
FRACTION, MODULUS = 20, 48


def fixed_point_diff(got: ClientUpdate, want: ClientUpdate) -> float:
    """The values' largest difference between two masked uploads, less one unit of the fixed point: the pads (the same
    seeds) cancel in the difference mod 2^b, and a float32 rounding across a rounding boundary moves a value by one unit
    (uniform weights: the values are the deltas)."""
    difference = decode((got.payload["masked"] - want.payload["masked"]) % (1 << MODULUS), MODULUS, FRACTION)
    return max(0.0, float(difference.abs().max()) - 2.0**-FRACTION)


@pytest.mark.parametrize("precision", ["64-true", "32-true"])
def test_secure_aggregation_equals_lightnings(precision: str) -> None:
    def algorithm() -> SecureAggregation:
        inner = FedAvg(weighting="uniform")
        return SecureAggregation(algorithm=inner, fraction_bits=FRACTION, modulus_bits=MODULUS)

    compare(mlp, precision, algorithm=algorithm, update_diff=fixed_point_diff)


#: Each algorithm the batched executor refuses for a reason of its own, and words of that reason.
REFUSED: dict[str, tuple[Callable[[], Algorithm], str]] = {
    "fedsoft-persisted-optimizer": (
        lambda: FedSoft(persist_optimizer_state=True),
        r"cannot train FedSoft: persist_optimizer_state carries each client's optimizer state between its rounds",
    ),
    "fedem": (FedEM, r"cannot train FedEM: each client trains its M components one after another"),
    "fedpm": (FedPM, r"cannot train FedPM: ProbabilityMaskMixin samples the Bernoulli masks in every forward pass"),
    "fedbuff": (lambda: FedBuff(buffer_size=2), r"cannot train FedBuff: it is asynchronous"),
    "fedstaleweight": (lambda: FedStaleWeight(buffer_size=2), r"cannot train FedStaleWeight: it is asynchronous"),
    "fedasync": (FedAsync, r"cannot train FedAsync: it is asynchronous"),
    "inside-a-wrapper": (
        lambda: Byzantine(attack=LabelFlip(num_classes=4), fraction=0.2, algorithm=FedSoft(persist_optimizer_state=True)),
        r"cannot train FedSoft \(inside Byzantine\): persist_optimizer_state carries",
    ),
}


@pytest.mark.parametrize("refused", list(REFUSED))
def test_a_refused_algorithm_is_refused_with_its_own_reason(refused: str) -> None:
    algorithm, reason = REFUSED[refused]
    with pytest.raises(ValueError, match=rf"^client_executor='batched' {reason}.* Use client_executor='lightning' or 'lean'\.$"):
        quiet_trainer(client_executor="batched", algorithm=algorithm())


def library_algorithms() -> list[type[Algorithm]]:
    """Every concrete algorithm the library exports."""
    packages = ("fl_lightning.algorithms", "fl_lightning.privacy", "fl_lightning.robust", "fl_lightning.secure")
    classes = (getattr(module, name) for module in map(importlib.import_module, packages) for name in module.__all__)
    return [c for c in classes if inspect.isclass(c) and issubclass(c, Algorithm) and not inspect.isabstract(c)]


@pytest.mark.parametrize("algorithm", library_algorithms(), ids=lambda c: c.__name__)
def test_every_library_algorithm_trains_batched_or_says_why(algorithm: type[Algorithm]) -> None:
    """The generic configure_client refusal is for a user's own algorithm only: each of the library's configure_client
    is Algorithm's (nothing), AlgorithmWrapper's (passed on) or declared, or the algorithm gives its own reason."""
    definer = next(cls for cls in algorithm.__mro__ if "configure_client" in vars(cls))
    declared = definer in (Algorithm, AlgorithmWrapper) or vars(definer).get("configure_client_sets_terms", False)
    assert declared or algorithm.batched_refusal


def test_wrappers_pass_on_the_declarations_of_the_algorithm_they_wrap() -> None:
    inner = TrimmedMean(algorithm=FedProx(mu=0.1))
    assert configure_client_definer(Byzantine(attack=SignFlip(), fraction=0.2, algorithm=inner)) is FedProx
