"""Reddi et al.'s next-token LSTMs: shapes against the reference Keras models, the padding-free loss and
the accuracy that leaves out the tokens the reference metric masks, both against a NumPy reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fl_lightning.data.datasets.tff import TffShakespeare
from fl_lightning.models import ShakespeareLSTM, StackOverflowLSTM

from ..data.datasets.tff_files import write_tff_sqlite
from ..quiet import quiet_trainer

# _evaluate runs outside a Trainer here: Lightning's self.log warns and does nothing; the metric still updates.
pytestmark = pytest.mark.filterwarnings("ignore:You are trying to")


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def keras_lstm(n_in: int, units: int) -> int:
    return 4 * units * (n_in + units + 1)


def test_shakespeare_lstm_matches_the_reference_up_to_pytorchs_second_lstm_bias():
    # shakespeare_models.create_recurrent_model(vocab_size=86 + 4): embedding 90x8, LSTM(256) twice, dense 256 -> 90.
    reference = 90 * 8 + keras_lstm(8, 256) + keras_lstm(256, 256) + (256 + 1) * 90
    assert reference == 820_522
    assert count(ShakespeareLSTM()) == reference + 2 * 4 * 256


def test_stackoverflow_lstm_matches_the_reference_up_to_pytorchs_second_lstm_bias():
    # stackoverflow_models.create_recurrent_model(): 10,000 words + pad/oov/bos/eos, embedding 96, LSTM 670, dense 96, dense out.
    extended = 10_000 + 4
    reference = extended * 96 + keras_lstm(96, 670) + (670 + 1) * 96 + (96 + 1) * extended
    assert reference == 4_050_748
    assert count(StackOverflowLSTM()) == reference + 4 * 670


def test_stackoverflow_leaves_padding_oov_bos_and_eos_out_of_the_accuracy():
    assert StackOverflowLSTM(vocab_size=100, num_oov_buckets=2).uncounted_ids() == [0, 101, 102, 103, 104]
    assert ShakespeareLSTM().uncounted_ids() == [0]
    with pytest.raises(ValueError, match="`num_oov_buckets` must be an integer >= 1, got 0"):
        StackOverflowLSTM(num_oov_buckets=0)


def test_forget_gate_bias_starts_at_one_as_keras():
    lstm = StackOverflowLSTM(vocab_size=20, hidden=8).lstm
    assert torch.equal(lstm.bias_ih_l0[8:16], torch.ones(8))
    assert torch.count_nonzero(lstm.bias_ih_l0) == 8 and torch.count_nonzero(lstm.bias_hh_l0) == 0


def numpy_reference(logits: np.ndarray, y: np.ndarray, uncounted: list[int]) -> tuple[float, float]:
    """Mean cross-entropy over non-padding targets; accuracy over targets outside ``uncounted``."""
    logits, y = logits.reshape(-1, logits.shape[-1]).astype(np.float64), y.reshape(-1)
    log_probs = logits - logits.max(1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(1, keepdims=True))
    tokens = y != 0
    loss = -log_probs[tokens, y[tokens]].mean()
    counted = ~np.isin(y, uncounted)
    return float(loss), float((logits.argmax(1) == y)[counted].mean())


def test_loss_and_accuracy_match_a_numpy_reference_on_padded_batches():
    torch.manual_seed(0)
    model = StackOverflowLSTM(vocab_size=6, embedding_dim=4, hidden=8).eval()  # ids: pad 0, words 1-6, oov 7, bos 8, eos 9
    x = torch.randint(1, 10, (5, 7))
    y = torch.randint(0, 10, (5, 7))
    y[:, -2:] = 0  # padded tails
    with torch.no_grad():
        logits = model(x)
        loss = model.training_step((x, y), 0)
        model._evaluate((x, y), "val", model.val_acc)  # self.log is a no-op without a trainer; the metric updates
    expected_loss, expected_acc = numpy_reference(logits.numpy(), y.numpy(), [0, 7, 8, 9])
    assert loss.item() == pytest.approx(expected_loss, rel=1e-5)
    assert model.val_acc.compute().item() == pytest.approx(expected_acc)


def test_sample_metrics_are_per_sequence():
    model = ShakespeareLSTM(hidden=8).eval()
    x, y = torch.randint(1, 90, (3, 6)), torch.randint(1, 90, (3, 6))
    y[0, 3:] = 0
    with torch.no_grad():
        metrics = model.sample_metrics((x, y))
        logits = model(x)
    loss0, acc0 = numpy_reference(logits[:1].numpy(), y[:1].numpy(), [0])
    assert metrics["loss"][0].item() == pytest.approx(loss0, rel=1e-5)
    assert metrics["correct"][0].item() == pytest.approx(acc0)
    assert metrics["loss"].shape == metrics["correct"].shape == (3,)


def test_next_token_models_reload_from_their_hyperparameters():
    for model in (ShakespeareLSTM(hidden=8, lr=1.0), StackOverflowLSTM(vocab_size=30, hidden=8, num_oov_buckets=2)):
        clone = type(model)(**model.hparams)
        assert [p.shape for p in clone.parameters()] == [p.shape for p in model.parameters()]
        assert clone.uncounted_ids() == model.uncounted_ids()


def test_a_model_sized_for_other_data_is_refused_at_fit(tmp_path: Path):
    write_tff_sqlite(tmp_path / "shakespeare.sqlite", {"train": {"A": [{"snippets": [b"to be"]}]}, "test": {"A": [{"snippets": [b"or"]}]}})
    trainer = quiet_trainer(max_epochs=1, clients_per_round=1)
    with pytest.raises(ValueError, match="predicts 80 classes .* but TffShakespeare has 90"):
        trainer.fit(ShakespeareLSTM(vocab_size=80, hidden=4), datamodule=TffShakespeare(str(tmp_path), sequence_length=4))
