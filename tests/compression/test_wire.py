"""Shared wire format: bit packing, layouts, dense sections, header validation."""

from __future__ import annotations

import pytest
import torch

from fl_lightning.compression import Layout, PayloadError, StochasticSignCodec, TensorSpec
from fl_lightning.compression.wire import (
    PREFIX,
    VERSION,
    as_wire,
    decode_dense,
    encode_dense,
    from_wire,
    pack_bits,
    unpack_bits,
)


@pytest.mark.parametrize("numel", [1, 7, 8, 13, 64, 1001])
def test_bit_packing_round_trip(numel):
    bits = torch.rand(numel, generator=torch.Generator().manual_seed(numel)) < 0.5
    packed = pack_bits(bits)
    assert packed.dtype == torch.uint8 and packed.numel() == (numel + 7) // 8
    assert torch.equal(unpack_bits(packed, numel), bits)


def test_bit_order_is_least_significant_first():
    assert pack_bits(torch.tensor([True] + [False] * 7)).tolist() == [1]
    assert pack_bits(torch.tensor([False] * 7 + [True])).tolist() == [128]


def test_unpack_rejects_wrong_size_and_padding():
    with pytest.raises(PayloadError, match="13 bits need 2 bytes, got 3"):
        unpack_bits(torch.zeros(3, dtype=torch.uint8), 13)
    with pytest.raises(PayloadError, match="padding"):
        unpack_bits(torch.tensor([0, 0b1000_0000], dtype=torch.uint8), 13)


def test_layout_splits_in_state_order():
    state = {"a": torch.zeros(2, 3), "b": torch.zeros(4), "n": torch.tensor(3), "c": torch.zeros(5)}
    layout = Layout.from_state(state, ["c", "a"])
    assert [s.name for s in layout.compressed] == ["a", "c"]
    assert [s.name for s in layout.dense] == ["b", "n"]
    assert layout.dense_numel == 5
    with pytest.raises(ValueError, match=r"\['x'\] are not in the model state"):
        Layout.from_state(state, ["x"])
    with pytest.raises(ValueError, match=r"\['n'\] are not"):
        Layout.from_state(state, ["n"])


def test_dense_section_float32_and_int32():
    specs = [TensorSpec("w", (2, 2), torch.float32), TensorSpec("n", (), torch.int64)]
    tensors = {"w": torch.tensor([[1.5, -2.0], [3.25, 0.0]]), "n": torch.tensor(-7)}
    data = encode_dense(tensors, specs)
    assert len(data) == 4 * 5
    out = decode_dense(data, specs, "cpu")
    assert torch.equal(out["w"], tensors["w"]) and out["n"].dtype == torch.int64 and out["n"].item() == -7
    with pytest.raises(ValueError, match="outside int32"):
        encode_dense({"w": tensors["w"], "n": torch.tensor(2**40)}, specs)


def test_wire_wrapping():
    assert from_wire(as_wire(b"\x01\x02")) == b"\x01\x02"
    with pytest.raises(PayloadError, match="Expected an encoded payload"):
        from_wire({"w": torch.zeros(2)})


def _sign_payload():
    state = {"w": torch.randn(3, 5), "b": torch.randn(3)}
    layout = Layout.from_state(state, ["w"])
    codec = StochasticSignCodec()
    return codec, layout, codec.encode(state, layout, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    ("corrupt", "match"),
    [
        (lambda p: p[:-1], "has 21 bytes; this model's layout needs exactly 22"),
        (lambda p: p + b"\x00", "has 23 bytes"),
        (lambda p: p[:3], "shorter than the 4-byte header"),
        (lambda p: b"XX" + p[2:], "Bad magic"),
        (lambda p: p[:2] + bytes([VERSION + 1]) + p[3:], f"Unknown payload version {VERSION + 1}"),
        (lambda p: p[:3] + bytes([9]) + p[4:], "codec id 9"),
    ],
    ids=["truncated", "too-long", "no-header", "magic", "version", "codec"],
)
def test_header_and_length_validation(corrupt, match):
    codec, layout, payload = _sign_payload()
    assert len(payload) == 22 == PREFIX.size + (4 + 2) + 4 * 3
    codec.decode(payload, layout)
    with pytest.raises(PayloadError, match=match):
        codec.decode(corrupt(payload), layout)
