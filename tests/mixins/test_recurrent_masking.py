"""FedMRN masks Embedding and recurrent (GRU, LSTM) weights by default, and the swap reaches them: the
latent update of every masked tensor gets a gradient, and the server adds masked noise to each."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fl_lightning import FedMRN

from ..algorithms.fedmrn_fixtures import SequenceMasked, sequence_data, trainer

ALPHA = 1e-2  # FedMRN's default uniform noise magnitude for binary masks


@pytest.mark.parametrize("rnn", [nn.GRU, nn.LSTM])
def test_embedding_and_recurrent_weights_are_masked_and_trained(rnn: type[nn.RNNBase]) -> None:
    torch.manual_seed(0)
    model = SequenceMasked(rnn)
    masked = ["embedding.weight", "rnn.weight_ih_l0", "rnn.weight_hh_l0", "head.weight"]
    assert model.maskable_parameter_names() == masked
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    latent: dict[str, torch.Tensor] = {}
    end_round = model.end_masked_noise_round

    def record_latent_updates(generator=None):
        latent.update({name: u.detach().clone() for name, u in model.latent_updates().items()})
        return end_round(generator)

    model.end_masked_noise_round = record_latent_updates  # type: ignore[method-assign]
    trainer(max_epochs=1, clients_per_round=1, local_steps=3, algorithm=FedMRN()).fit(model, datamodule=sequence_data())
    assert all(latent[name].abs().sum() > 0 for name in masked)  # the swapped weight was in the forward's graph
    for name in masked:
        delta = model.state_dict()[name] - before[name]
        # n ⊙ m with n ~ U(-alpha, alpha): bounded by alpha, zero where the mask is 0.
        assert 0 < delta.abs().max() <= ALPHA and (delta == 0).any(), name
