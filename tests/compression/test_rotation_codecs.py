"""DRIVE / EDEN codecs: the Hadamard rotation, the decoded form, (approximate) unbiasedness, exact
sizes, malformed payloads, determinism, and a run through the trainer."""

from __future__ import annotations

import math
import struct

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from scipy.linalg import hadamard

from fl_lightning import CompressedFedAvg
from fl_lightning.compression import DriveCodec, EdenCodec, Layout, PayloadError, TopKCodec
from fl_lightning.compression.hadamard import fwht, padded_length, rotate, unrotate
from fl_lightning.compression.rotation import normal_lloyd_max
from fl_lightning.compression.wire import PREFIX

from ..algorithms.fedmrn_fixtures import digits, tiny, trainer
from .test_baselines import layout_of, make_state

SEED_AND_SCALE = 12  # uint64 rotation seed + float32 scale per tensor


def encode_decode(codec, x, seed=0):
    state = {"w": x}
    layout = Layout.from_state(state, ["w"])
    payload = codec.encode(state, layout, generator=torch.Generator().manual_seed(seed))
    return payload, codec.decode(payload, layout)["w"]


@pytest.mark.parametrize("length", [1, 2, 4, 8, 16, 64])
def test_fwht_is_the_orthonormal_sylvester_hadamard_and_its_own_inverse(length):
    matrix = torch.from_numpy(hadamard(length)).double() / math.sqrt(length)
    assert torch.allclose(fwht(torch.eye(length, dtype=torch.float64)), matrix)  # batched over rows; H = H^T
    assert torch.allclose(matrix @ matrix.T, torch.eye(length, dtype=torch.float64))
    x = torch.randn(3, length, generator=torch.Generator().manual_seed(length), dtype=torch.float64)
    assert torch.allclose(fwht(fwht(x)), x)


def test_rotation_pads_preserves_the_norm_and_inverts():
    assert [padded_length(d) for d in (0, 1, 2, 3, 8, 9, 108)] == [1, 1, 2, 4, 8, 16, 128]
    x = torch.randn(100, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = rotate(x, seed=7)
    assert y.numel() == 128 and torch.isclose(y.norm(), x.norm())
    assert torch.allclose(unrotate(y, seed=7)[:100], x) and unrotate(y, seed=7)[100:].abs().max() < 1e-12
    assert not torch.allclose(unrotate(y, seed=8)[:100], x)
    with pytest.raises(ValueError, match="power-of-two length, got 12"):
        fwht(torch.zeros(12))


def test_drive_decodes_to_scale_times_rotated_back_signs():
    x = torch.randn(100, generator=torch.Generator().manual_seed(1))
    payload, decoded = encode_decode(DriveCodec(), x)
    seed = int.from_bytes(payload[PREFIX.size : PREFIX.size + 8], "little")
    rotated = rotate(x, seed)
    signs = torch.where(rotated >= 0, 1.0, -1.0)
    scale = x.square().sum() / rotated.abs().sum()  # ||x||^2 / ||Rx||_1
    assert torch.allclose(decoded, scale * unrotate(signs, seed)[:100], atol=1e-6)
    assert torch.isclose(decoded @ x, x @ x, rtol=1e-5)  # <x_hat, x> = ||x||^2 exactly
    # One bit per coordinate: the decoded error is large (NMSE -> pi/2 - 1 for large D), not zero.
    assert 0.3 < float((decoded - x).square().sum() / x.square().sum()) < 0.9


def test_eden_levels_and_its_one_bit_equivalence_to_drive():
    assert normal_lloyd_max(1) == pytest.approx((-math.sqrt(2 / math.pi), math.sqrt(2 / math.pi)))
    assert normal_lloyd_max(2)[2:] == pytest.approx((0.4528, 1.5104), abs=1e-4)  # Max (1960), Table I
    assert normal_lloyd_max(4)[-1] == pytest.approx(2.7326, abs=1e-4)
    x = torch.randn(300, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(encode_decode(EdenCodec(), x)[1], encode_decode(DriveCodec(), x)[1], atol=1e-6)
    errors = []
    for bits in (1, 2, 3, 4):
        decoded = encode_decode(EdenCodec(bits=bits), x)[1]
        assert torch.isclose(decoded @ x, x @ x, rtol=1e-5)
        errors.append(float((decoded - x).square().sum() / x.square().sum()))
    assert errors == sorted(errors, reverse=True) and errors[-1] < 0.02


@pytest.mark.parametrize("codec", [DriveCodec(), EdenCodec(bits=2)], ids=["drive", "eden2"])
def test_averaged_decodes_approach_x(codec):
    # Every tensor of the layout draws its own rotation seed: 2000 independent decodes of x.
    trials, x = 2000, torch.randn(200, generator=torch.Generator().manual_seed(3))
    state = {f"w{i}": x for i in range(trials)}
    layout = Layout.from_state(state, list(state))
    decoded = torch.stack(
        list(codec.decode(codec.encode(state, layout, generator=torch.Generator().manual_seed(4)), layout).values())
    )
    mean, std_error = decoded.mean(dim=0), decoded.std(dim=0) / math.sqrt(trials)
    assert ((mean - x).abs() / std_error).max() < 5  # 200 coordinates, each within 5 standard errors
    assert (mean - x).norm() < 0.05 * x.norm()  # vs one decode's error of ~0.8 ||x|| (DRIVE)


def test_hadamard_rotation_is_biased_on_tiny_inputs():
    # The caveat of the docstring: (a, b), a > |b| > 0, always decodes to ((a^2 + b^2) / a, 0).
    for seed in range(5):
        assert torch.allclose(encode_decode(DriveCodec(), torch.tensor([2.0, 1.0]), seed)[1], torch.tensor([2.5, 0.0]))


@pytest.mark.parametrize(
    ("codec", "bits"), [(DriveCodec(), 1), (EdenCodec(), 1), (EdenCodec(bits=3), 3)], ids=["drive", "eden", "eden3"]
)
def test_payload_size_formula(codec, bits):
    state = make_state()
    layout = layout_of(state)
    payload = codec.encode(state, layout, generator=torch.Generator().manual_seed(1))
    # conv: d = 108 and fc: d = 70 both pad to D = 128; the fp32 bias is 16 bytes.
    expected = PREFIX.size + 2 * (SEED_AND_SCALE + math.ceil(128 * bits / 8)) + 4 * 4
    assert len(payload) == codec.payload_size(layout) == expected
    out = codec.decode(payload, layout)
    assert torch.equal(out["bias"], state["bias"]) and all(out[k].shape == state[k].shape for k in state)


def test_zero_tensor_round_trips():
    payload, decoded = encode_decode(EdenCodec(bits=2), torch.zeros(5))
    assert torch.equal(decoded, torch.zeros(5))


def test_same_seed_same_bytes():
    x = torch.randn(50, generator=torch.Generator().manual_seed(5))
    for codec in (DriveCodec(), EdenCodec(bits=2)):
        assert encode_decode(codec, x, seed=9)[0] == encode_decode(codec, x, seed=9)[0]
        assert encode_decode(codec, x, seed=9)[0] != encode_decode(codec, x, seed=10)[0]


def test_malformed_payloads_raise():
    x = torch.randn(3)  # D = 4: 4 bits used of the section's one byte
    state, codec = {"w": x}, DriveCodec()
    layout = Layout.from_state(state, ["w"])
    payload = codec.encode(state, layout, generator=torch.Generator().manual_seed(0))
    scale_at = PREFIX.size + 8

    def corrupt(offset: int, data: bytes) -> bytes:
        return payload[:offset] + data + payload[offset + len(data) :]

    with pytest.raises(PayloadError, match="needs exactly"):
        codec.decode(payload[:-1], layout)
    with pytest.raises(PayloadError, match="must be finite and >= 0, got -1.0"):
        codec.decode(corrupt(scale_at, struct.pack("<f", -1.0)), layout)
    with pytest.raises(PayloadError, match="must be finite and >= 0, got nan"):
        codec.decode(corrupt(scale_at, struct.pack("<f", math.nan)), layout)
    with pytest.raises(PayloadError, match="Non-zero padding bits"):
        codec.decode(corrupt(len(payload) - 1, bytes([payload[-1] | 0x80])), layout)
    with pytest.raises(PayloadError, match="codec id 6, not EdenCodec"):
        EdenCodec().decode(payload, layout)
    with pytest.raises(ValueError, match="`bits` must be 1, 2, 3 or 4, got 5"):
        EdenCodec(bits=5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_encode_decodes_like_cpu():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(6))
    state, codec = {"w": x.cuda()}, EdenCodec(bits=2)
    layout = Layout.from_state(state, ["w"])
    payload = codec.encode(state, layout, generator=torch.Generator(device="cuda").manual_seed(0))
    on_gpu, on_cpu = codec.decode(payload, layout, device="cuda")["w"], codec.decode(payload, layout)["w"]
    assert torch.allclose(on_gpu.cpu(), on_cpu, atol=1e-5) and torch.isclose(on_cpu @ x, x @ x, rtol=1e-4)


def test_drive_through_the_trainer_learns():
    class Record(Callback):
        def __init__(self) -> None:
            self.loss: list[float] = []

        def on_train_epoch_end(self, trainer, pl_module):
            self.loss.append(float(trainer.callback_metrics["round/train_loss"]))

    record, algorithm = Record(), CompressedFedAvg(codec=DriveCodec())
    run = trainer(max_epochs=5, clients_per_round=3, local_epochs=1, algorithm=algorithm, callbacks=[record])
    run.fit(tiny(hidden=64, lr=0.3), datamodule=digits(batch_size=16))
    assert run.fit_loop.total_upload_bytes == 5 * 3 * algorithm.codec.payload_size(algorithm.layout)
    assert algorithm.codec.payload_size(algorithm.layout) < TopKCodec(density=0.03).payload_size(algorithm.layout)
    assert run.callback_metrics["round/rejected_clients"].item() == 0
    assert record.loss[-1] < 0.7 * record.loss[0]
