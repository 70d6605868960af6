"""FedMRN leaves nothing silent: it says which tensors go up masked and which in full precision, warns when
less than most of the model is masked, drops a diverged client (its all-zero mask looks finite) and refuses a
``training_step`` that bypasses the mixin's (its masks would be noise)."""

from __future__ import annotations

import logging

import pytest
from torch import nn

from fl_lightning import FedMRN, FederatedTrainer

from fl_lightning.mixins import MaskedNoiseMixin

from .fedmrn_fixtures import SequenceMasked, SequenceModel, sequence_data, trainer


def one_client_step() -> FederatedTrainer:
    return trainer(max_epochs=1, clients_per_round=1, local_steps=1, algorithm=FedMRN())


def test_setup_reports_masked_and_full_precision_tensors(
    caplog: pytest.LogCaptureFixture, recwarn: pytest.WarningsRecorder
) -> None:
    with caplog.at_level(logging.INFO):
        one_client_step().fit(SequenceMasked(nn.GRU), datamodule=sequence_data())
    # Embedding 12x8 + GRU 3*16x8 and 3*16x16 + head 3x16 masked; GRU biases 2*48 and the head's 3 not.
    expected = (
        "FedMRN masks 4 tensors (1,296 values, 92.9% of the shared ones): embedding.weight, rnn.weight_ih_l0, "
        "rnn.weight_hh_l0, head.weight; in full precision: rnn.bias_ih_l0, rnn.bias_hh_l0, head.bias (99 values)."
    )
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("FedMRN masks")] == [expected]
    assert not [w for w in recwarn if "masks only" in str(w.message)]


def test_a_mostly_unmasked_model_warns_with_its_compression() -> None:
    model = SequenceMasked(nn.GRU)
    model.maskable_parameter_names = lambda: ["head.weight"]  # type: ignore[method-assign]
    # 48 of 1,395 values masked: (32 * 1,395) / (48 + 32 * 1,347) = 1.03x.
    with pytest.warns(UserWarning, match=r"FedMRN masks only 3\.4% of the shared \(sent\) values \(head\.weight\).* about 1\.0x smaller"):
        one_client_step().fit(model, datamodule=sequence_data())


class PoisonsClientZero(FedMRN):
    """FedMRN whose client 0 diverges (NaN training loss)."""

    def configure_client(self, client, module, global_state):
        module.poisoned = client.client_id == 0
        super().configure_client(client, module, global_state)


def test_a_client_whose_loss_went_nan_is_dropped_and_counted() -> None:
    run = trainer(max_epochs=1, clients_per_round=3, local_steps=2, algorithm=PoisonsClientZero())
    with pytest.warns(UserWarning, match=r"Round 0: client 0 sent a non-finite update \(its training loss is NaN/Inf\); it is dropped"):
        run.fit(SequenceMasked(nn.GRU), datamodule=sequence_data())
    assert run.callback_metrics["round/dropped_clients"] == 1
    assert run.callback_metrics["round/aggregated_clients"] == 2


class MixinBypassed(MaskedNoiseMixin, SequenceModel):
    """Defines training_step below the mixin without calling super(): the mixin never draws a weight."""

    def training_step(self, batch, batch_idx):
        return SequenceModel.training_step(self, batch, batch_idx)


def test_a_training_step_that_bypasses_the_mixin_is_refused_naming_the_fix() -> None:
    # Its masks would be random: the latent updates never enter the forward, so they never train.
    with pytest.raises(TypeError, match=r"MixinBypassed.training_step bypasses MaskedNoiseMixin.training_step.*mixin first among the bases"):
        one_client_step().fit(MixinBypassed(), datamodule=sequence_data())
