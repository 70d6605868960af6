"""Attacks: the seeded malicious set, each poisoned update and batch, and a fit under attack."""

from __future__ import annotations

import pytest
import torch

from fl_lightning import FedAvg
from fl_lightning.algorithms import ClientContext
from fl_lightning.models import MLP
from fl_lightning.robust import Byzantine, CoordinateMedian, GaussianUpdate, LabelFlip, ScaledUpdate, SignFlip, malicious_clients
from tests.algorithms.test_fedavg import federation  # noqa: F401 (fixture)
from tests.integration.conftest import digits_data, quiet_trainer
from tests.recording_logger import RecordingLogger

DELTA = {"w": torch.tensor([1.0, -2.0, 3.0]), "count": torch.tensor(4)}


def test_malicious_set_is_seeded_and_sized():
    chosen = malicious_clients(100, 0.3, seed=5)
    assert len(chosen) == 30 and chosen == malicious_clients(100, 0.3, seed=5)
    assert chosen != malicious_clients(100, 0.3, seed=6)
    assert malicious_clients(10, 0.0, seed=0) == frozenset()


@pytest.mark.parametrize(
    ("attack", "expected"),
    [(SignFlip(), [-1.0, 2.0, -3.0]), (SignFlip(scale=2.0), [-2.0, 4.0, -6.0]), (ScaledUpdate(scale=10.0), [10.0, -20.0, 30.0])],
)
def test_model_poisoning_updates(attack, expected):
    poisoned = attack.poison_update(DELTA, torch.Generator())
    assert poisoned["w"].tolist() == expected and poisoned["count"] == 4  # counters untouched


def test_gaussian_update_replaces_the_delta_with_seeded_noise():
    attack = GaussianUpdate(std=3.0)
    big = {"w": torch.zeros(100_000)}
    a = attack.poison_update(big, torch.Generator().manual_seed(1))["w"]
    assert torch.equal(a, attack.poison_update(big, torch.Generator().manual_seed(1))["w"])
    assert a.std().item() == pytest.approx(3.0, rel=0.02)  # 1e5 draws: relative error of the std 0.22 %


def test_label_flip_maps_y_to_c_minus_1_minus_y():
    x, y = torch.zeros(4, 2), torch.tensor([0, 3, 9, 5])
    flipped = LabelFlip(num_classes=10).poison_batch((x, y))
    assert flipped[0] is x and flipped[1].tolist() == [9, 6, 0, 4]


def test_only_malicious_clients_poison_their_upload(federation):  # noqa: F811
    algorithm = Byzantine(attack=SignFlip(), fraction=0.5)
    algorithm.setup(federation)
    assert len(algorithm.malicious) == 2
    for cid in range(4):
        client = ClientContext(round_idx=0, client_id=cid, num_samples=1, num_epochs=1, num_steps=None, seed=cid)
        sent = algorithm.client_update(client, federation.module, dict(DELTA)).payload["w"]
        assert sent.tolist() == ([-1.0, 2.0, -3.0] if cid in algorithm.malicious else [1.0, -2.0, 3.0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"fraction": 1.0}, "fraction"), ({"fraction": -0.1}, "fraction")],
)
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Byzantine(**{"attack": SignFlip(), "fraction": 0.2, **kwargs})


def test_label_flipping_clients_train_on_flipped_batches_in_a_fit():
    logger = RecordingLogger()
    algorithm = Byzantine(attack=LabelFlip(num_classes=10), fraction=0.5, algorithm=CoordinateMedian(algorithm=FedAvg()))
    trainer = quiet_trainer(algorithm=algorithm, clients_per_round=8, local_steps=2, max_epochs=1, logger=logger)
    trainer.fit(MLP(in_features=64, hidden=(16,), lr=0.1), datamodule=digits_data(num_clients=8))

    data = trainer.fit_loop.federation.data
    bad, good = min(algorithm.malicious), min(set(range(8)) - algorithm.malicious)
    original = trainer.datamodule
    for cid, flipped in [(bad, True), (good, False)]:
        _, y_seen = next(iter(data.client_batches(cid, num_epochs=1, generator=torch.Generator().manual_seed(0))))
        _, y_true = next(iter(original.client_batches(cid, num_epochs=1, generator=torch.Generator().manual_seed(0))))
        assert torch.equal(y_seen, 9 - y_true if flipped else y_true)
    assert [m["round/malicious_clients"] for _, m in logger.records if "round/malicious_clients" in m] == [4.0]
