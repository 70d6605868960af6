"""CompressedFedAvg: baselines through the loop with exact bytes; decoded deltas averaged as FedAvg."""

from __future__ import annotations

import pytest
import torch

from fl_lightning import CompressedFedAvg, FedAvg
from fl_lightning.compression import MaskedNoiseCodec, StochasticSignCodec, TernGradCodec, TopKCodec

from .fedmrn_fixtures import digits, tiny, trainer


@pytest.mark.parametrize(
    "codec", [StochasticSignCodec(), TernGradCodec(), TopKCodec(density=0.05)], ids=["sign", "terngrad", "topk"]
)
def test_baselines_through_the_loop(codec):
    model = tiny(batch_norm=True)
    algorithm = CompressedFedAvg(codec=codec)
    run = trainer(max_epochs=2, clients_per_round=3, local_steps=3, algorithm=algorithm)
    run.fit(model, datamodule=digits())
    assert [s.name for s in algorithm.layout.compressed] == ["net.0.weight", "net.3.weight"]
    assert run.fit_loop.total_upload_bytes == 2 * 3 * codec.payload_size(algorithm.layout)
    assert run.callback_metrics["round/rejected_clients"].item() == 0
    assert run.callback_metrics["round/compression_ratio"].item() > 4


def test_lossless_topk_equals_fedavg():
    # density 1 keeps every entry: the decoded deltas are the float32 deltas, so the run is FedAvg's.
    compressed, plain = tiny(batch_norm=True), tiny(batch_norm=True)
    trainer(max_epochs=2, clients_per_round=3, local_steps=3, algorithm=CompressedFedAvg(codec=TopKCodec(density=1.0))).fit(
        compressed, datamodule=digits()
    )
    trainer(max_epochs=2, clients_per_round=3, local_steps=3, algorithm=FedAvg()).fit(plain, datamodule=digits())
    for name, value in plain.state_dict().items():
        assert torch.equal(compressed.state_dict()[name], value), name


def test_codec_errors():
    with pytest.raises(TypeError, match="must be a fl_lightning.compression.Codec, got str"):
        CompressedFedAvg(codec="sign")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="does not compress dense deltas"):
        trainer(max_epochs=1, local_steps=1, algorithm=CompressedFedAvg(codec=MaskedNoiseCodec())).fit(
            tiny(), datamodule=digits()
        )
