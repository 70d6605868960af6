"""Robust rules and attacks over FedMRN's decoded masks and FedSoft's centres, against NumPy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fl_lightning import FedMRN, FedPM, FedSoft
from fl_lightning.robust import Byzantine, CoordinateMedian, Krum, LabelFlip, ScaledUpdate, SignFlip, TrimmedMean, rules
from tests.algorithms.fedmrn_fixtures import digits, tiny, trainer
from tests.algorithms.test_fedsoft import fit


def _flat(state, names) -> np.ndarray:
    return np.concatenate([state[n].double().reshape(-1).numpy() for n in names])


def test_the_median_of_fedmrn_s_decoded_masked_noise_updates_is_the_round_delta():
    algorithm = CoordinateMedian(algorithm=FedMRN())
    decoded = []
    decode = algorithm.inner.decode_update
    algorithm.inner.decode_update = lambda update: decoded.append(decode(update)) or decoded[-1]  # type: ignore[method-assign]
    model = tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer(max_epochs=1, clients_per_round=5, local_steps=3, algorithm=algorithm).fit(model, datamodule=digits())

    names = [n for n, t in before.items() if t.is_floating_point()]
    rows = np.stack([_flat(u.payload, names) for u in decoded])
    assert len(rows) == 5 and np.mean(rows != 0) < 0.9  # masks: many coordinates of each update are 0
    got = _flat(model.state_dict(), names) - _flat(before, names)
    np.testing.assert_allclose(got, np.median(rows, axis=0), rtol=1e-5, atol=1e-7)  # FedMRN's server step: SGD, lr 1
    assert not np.allclose(got, rows.mean(axis=0))


@pytest.mark.parametrize(
    ("make_rule", "reference"),
    [
        (CoordinateMedian, lambda x: np.median(x, axis=0)),
        (lambda **kw: TrimmedMean(beta=0.2, **kw), lambda x: np.sort(x, axis=0)[1:4].mean(axis=0)),
        (lambda **kw: Krum(num_byzantine=1, **kw), lambda x: rules.multi_krum(torch.tensor(x), 1).numpy()),
    ],
    ids=["median", "trimmed-mean", "krum"],
)
def test_each_fedsoft_centre_is_the_rule_of_its_members_models(make_rule, reference):
    fedsoft = FedSoft(num_clusters=2, clients_per_cluster=5)
    fit(make_rule(algorithm=fedsoft), rounds=1)
    (selected,) = fedsoft.selection_history
    for s, members in enumerate(selected):
        names = list(fedsoft.centres[s])
        rows = np.stack([_flat(fedsoft.models.get(c), names) for c in members])
        np.testing.assert_allclose(_flat(fedsoft.centres[s], names), reference(rows), rtol=1e-6, atol=1e-7)
        assert not np.allclose(_flat(fedsoft.centres[s], names), rows.mean(axis=0))


def test_krum_over_fedsoft_checks_n_against_the_clients_per_cluster():
    with pytest.raises(ValueError, match=r"n > 2f \+ 2 .*n=4 for f=1"):
        fit(Krum(num_byzantine=1, algorithm=FedSoft(num_clusters=2, clients_per_cluster=4)), rounds=1)


def test_label_flipping_attackers_against_the_median_of_fedmrn():
    algorithm = Byzantine(attack=LabelFlip(num_classes=10), fraction=0.4, algorithm=CoordinateMedian(algorithm=FedMRN()))
    run = trainer(max_epochs=1, clients_per_round=5, local_steps=2, algorithm=algorithm)
    run.fit(tiny(), datamodule=digits(num_clients=5))
    assert len(algorithm.malicious) == 2 and run.fit_loop.history == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize("inner", [FedMRN, lambda: FedSoft(num_clusters=2)], ids=["fedmrn", "fedsoft"])
@pytest.mark.parametrize("attack", [SignFlip(), ScaledUpdate(scale=10.0)], ids=["sign-flip", "scaled"])
def test_model_poisoning_is_refused_where_the_upload_is_not_the_delta(inner, attack):
    with pytest.raises(ValueError, match=f"{type(attack).__name__} poisons the client's delta.*uploads something else"):
        Byzantine(attack=attack, fraction=0.2, algorithm=inner())


def test_a_rule_over_an_aggregation_that_is_not_an_average_is_refused():
    with pytest.raises(ValueError, match="CoordinateMedian replaces the average .* FedPM aggregates otherwise"):
        CoordinateMedian(algorithm=FedPM())
