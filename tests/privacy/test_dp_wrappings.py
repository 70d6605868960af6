"""Every exported algorithm around and inside every DP mechanism: refused with one error naming both, or its
two-world sensitivity within what the accountant assumes (issue 38 items 1 and 5)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

import pytest

import fl_lightning as fl
from fl_lightning.algorithms import Algorithm
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper
from fl_lightning.compression import TopKCodec
from fl_lightning.privacy import DPFTRL, DPFedAvg, DPFedBuff, LocalDP
from fl_lightning.robust import Byzantine, SignFlip
from fl_lightning.secure import SecureAggregation
from tests.privacy import two_worlds
from tests.privacy.two_worlds import CLIP

BUFFER = 3

#: One instance of every exported algorithm; a wrapper's factory takes what it wraps (None: its default).
ALGORITHMS: dict[str, Callable[[Algorithm | None], Algorithm]] = {
    "AllClients": lambda inner: fl.AllClients(priority=2, algorithm=inner),
    "Bulyan": lambda inner: fl.Bulyan(num_byzantine=0, algorithm=inner),
    "Byzantine": lambda inner: Byzantine(attack=SignFlip(), fraction=0.25, algorithm=inner),
    "CompressedFedAvg": lambda _: fl.CompressedFedAvg(codec=TopKCodec(density=0.5)),
    "CoordinateMedian": lambda inner: fl.CoordinateMedian(algorithm=inner),
    "DPFedAvg": lambda inner: DPFedAvg(noise_multiplier=0.0, clip_norm=CLIP, algorithm=inner),
    "DPFTRL": lambda inner: DPFTRL(noise_multiplier=0.0, clip_norm=CLIP, algorithm=inner),
    "DPFedBuff": lambda inner: DPFedBuff(noise_multiplier=0.0, clip_norm=CLIP, algorithm=inner or fl.FedBuff(buffer_size=BUFFER)),
    "Ditto": lambda _: fl.Ditto(lam=0.1),
    "FedALIGN": lambda inner: fl.FedALIGN(priority=2, algorithm=inner),
    "FedAsync": lambda _: fl.FedAsync(),
    "FedAvg": lambda _: fl.FedAvg(),
    "FedAvg(uniform)": lambda _: fl.FedAvg(weighting="uniform"),
    "FedAvgSM": lambda _: fl.FedAvgSM(),
    "FedBN": lambda _: fl.FedBN(),
    "FedBuff": lambda _: fl.FedBuff(buffer_size=BUFFER),
    "FedDyn": lambda _: fl.FedDyn(),
    "FedEM": lambda _: fl.FedEM(),
    "FedMRN": lambda _: fl.FedMRN(),
    "FedMRNS": lambda _: fl.FedMRNS(),
    "FedNova": lambda _: fl.FedNova(),
    "FedPM": lambda _: fl.FedPM(),
    "FedPer": lambda _: fl.FedPer(personal=["fc"]),
    "FedProx": lambda _: fl.FedProx(mu=0.1),
    "FedSoft": lambda _: fl.FedSoft(num_clusters=2),
    "FedStaleWeight": lambda _: fl.FedStaleWeight(buffer_size=BUFFER),
    "FlexibleParticipation": lambda _: fl.FlexibleParticipation(),
    "IFCA": lambda _: fl.IFCA(num_clusters=2),
    "Krum": lambda inner: fl.Krum(num_byzantine=0, algorithm=inner),
    "LGFedAvg": lambda _: fl.LGFedAvg(local=["fc"]),
    "LocalDP": lambda inner: LocalDP(noise_multiplier=1.0, clip_norm=CLIP, algorithm=inner),
    "LocalOnly": lambda _: fl.LocalOnly(),
    "PriorityOnly": lambda inner: fl.PriorityOnly(priority=2, algorithm=inner),
    "QFedAvg": lambda _: fl.QFedAvg(),
    "SCAFFOLD": lambda _: fl.SCAFFOLD(),
    "SecureAggregation": lambda inner: SecureAggregation(algorithm=inner),
    "TrimmedMean": lambda inner: fl.TrimmedMean(beta=0.25, algorithm=inner),
}

#: Each DP mechanism around what it wraps (None: its default), with noise off (LocalDP's noise is the same
#: draw in both worlds instead, as it needs z > 0).
MECHANISMS: dict[str, Callable[[Algorithm | None], Algorithm]] = {
    "DPFedAvg-fixed": lambda inner: DPFedAvg(noise_multiplier=0.0, clip_norm=CLIP, sampling="fixed", algorithm=inner),
    "DPFedAvg-poisson": lambda inner: DPFedAvg(noise_multiplier=0.0, clip_norm=CLIP, sampling="poisson", algorithm=inner),
    "DPFedBuff": ALGORITHMS["DPFedBuff"],
    "DPFTRL": ALGORITHMS["DPFTRL"],
    "LocalDP": ALGORITHMS["LocalDP"],
}


def _exported() -> set[str]:
    classes = set()
    for module in ("fl_lightning", "fl_lightning.algorithms", "fl_lightning.privacy", "fl_lightning.robust", "fl_lightning.secure"):
        exported = importlib.import_module(module)
        for name in exported.__all__:
            value = getattr(exported, name)
            if inspect.isclass(value) and issubclass(value, Algorithm) and not inspect.isabstract(value):
                classes.add(value.__name__)
    return classes


def _compositions() -> list[tuple[str, Callable[[], Algorithm]]]:
    """``M(A)`` for every mechanism and algorithm, and ``A(M)`` for every wrapper ``A``."""
    pairs = []
    for m_name, mechanism in MECHANISMS.items():
        for a_name, algorithm in ALGORITHMS.items():
            pairs.append((f"{m_name}({a_name})", lambda m=mechanism, a=algorithm: m(a(None))))
            if issubclass(type(algorithm(None)), AlgorithmWrapper):
                pairs.append((f"{a_name}({m_name})", lambda m=mechanism, a=algorithm: a(m(None))))
    return pairs


def test_the_walk_covers_every_exported_algorithm():
    assert _exported() <= {name.split("(")[0] for name in ALGORITHMS}


@pytest.mark.parametrize(("name", "build"), _compositions(), ids=[name for name, _ in _compositions()])
def test_every_wrapping_is_refused_naming_both_or_moves_by_at_most_the_accounted_sensitivity(name, build):
    try:
        algorithm = build()
    except ValueError as error:
        outer, inner = name.split("(", 1)
        named = [part.split("-")[0].split("(")[0] for part in (outer, inner.rstrip(")"))]
        assert all(part in str(error) for part in named), f"{name}: {error}"
        return
    mechanism = two_worlds.mechanism_of(algorithm)
    accounted = two_worlds.accounted_sensitivity(mechanism)
    if isinstance(mechanism, LocalDP):
        shift, payload_only = two_worlds.local_shift(build)
        assert payload_only, f"{name}: the server's step reads an unnoised value of the client"
    else:
        shift = two_worlds.central_shift(build)
    assert shift <= accounted * (1 + 1e-6), f"{name}: moved by {shift}, accounted {accounted}"
    assert shift >= accounted * 0.5  # the harness reaches the bound (replace-one: exactly 2C; others: C)
