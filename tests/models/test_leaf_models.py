"""LEAF's FEMNIST CNN and Shakespeare stacked LSTM against the shapes of LEAF's TensorFlow code."""

from __future__ import annotations

import torch

from fl_lightning.models import FemnistCNN, ShakespeareStackedLSTM


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_femnist_cnn_has_leafs_layers_and_parameter_count():
    # models/femnist/cnn.py: conv 5x5x1->32 "same", pool, conv 5x5x32->64 "same", pool, dense 3136->2048, dense -> 62.
    reference = (5 * 5 * 1 + 1) * 32 + (5 * 5 * 32 + 1) * 64 + (7 * 7 * 64 + 1) * 2048 + (2048 + 1) * 62
    assert count(FemnistCNN()) == reference == 6_603_710


def test_femnist_cnn_reads_leaf_rows_and_images_alike():
    model = FemnistCNN().eval()
    images = torch.rand(3, 1, 28, 28)
    assert torch.equal(model(images.reshape(3, 784)), model(images))
    assert model(images).shape == (3, 62)


def test_stacked_lstm_matches_leaf_up_to_pytorchs_second_lstm_bias():
    # stacked_lstm.py: embedding 80x8, two BasicLSTMCell(256) (kernel (in + 256) x 1024, one bias of 1024), dense 256 -> 80.
    lstm = lambda n_in: (n_in + 256) * 4 * 256 + 4 * 256  # noqa: E731
    reference = 80 * 8 + lstm(8) + lstm(256) + (256 + 1) * 80
    assert reference == 817_872
    assert count(ShakespeareStackedLSTM()) == reference + 2 * 4 * 256


def test_stacked_lstm_predicts_one_character_from_the_last_step():
    model = ShakespeareStackedLSTM().eval()
    x = torch.randint(0, 80, (4, 80))
    assert model(x).shape == (4, 80)
    changed = x.clone()
    changed[:, -1] = (x[:, -1] + 1) % 80
    assert not torch.equal(model(x), model(changed))  # the last character is read


def test_stacked_lstm_reloads_from_its_hyperparameters():
    model = ShakespeareStackedLSTM(hidden=16, lr=0.8)
    clone = type(model)(**model.hparams)
    assert [p.shape for p in clone.parameters()] == [p.shape for p in model.parameters()]
    assert clone.lr == 0.8
