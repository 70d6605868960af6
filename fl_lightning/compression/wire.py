"""The wire format every codec shares: a versioned header, tensor layouts, bit packing and
full-precision sections.

A payload is ``prefix | codec header fields | one section per compressed tensor | dense section``:

- prefix (4 bytes): magic ``b"FL"``, format version (``uint8``), codec id (``uint8``);
- codec header fields: fixed per codec (e.g. FedMRN's seed), little-endian;
- compressed sections: fixed size per tensor, in :class:`Layout` order;
- dense section: every other tensor at 4 bytes per element (``float32``, or ``int32`` for
  integer tensors such as BatchNorm's ``num_batches_tracked``), little-endian, C order.

The server knows the model, so the payload carries no names or shapes and its length is
fully determined by the layout: any other length is rejected.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

#: First two bytes of every payload.
MAGIC = b"FL"
#: The payload format version this code writes and reads.
VERSION = 1
#: ``magic, version, codec id``.
PREFIX = struct.Struct("<2sBB")
#: Key under which :class:`~fl_lightning.ClientUpdate` carries an encoded payload (a ``uint8`` tensor).
WIRE_KEY = "__wire__"

_BIT_WEIGHTS = 2 ** torch.arange(8, dtype=torch.uint8)


class PayloadError(ValueError):
    """A payload that cannot be decoded: wrong length, bad header, unknown version or invalid content."""


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of one tensor of the model's state."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class Layout:
    """Which state tensors a codec compresses and which it sends in full precision, in state order."""

    compressed: tuple[TensorSpec, ...]
    dense: tuple[TensorSpec, ...]

    @classmethod
    def from_state(cls, state: Mapping[str, Tensor], compressed: Collection[str]) -> Layout:
        """Splits ``state`` (e.g. the global state) into the ``compressed`` names and the rest.

        Raises:
            ValueError: a name in ``compressed`` is not a floating-point tensor of ``state``.
        """
        missing = sorted(set(compressed) - set(state))
        if missing:
            raise ValueError(f"Compressed tensors {missing} are not in the model state.")
        integer = sorted(n for n in compressed if not state[n].is_floating_point())
        if integer:
            raise ValueError(f"Only floating-point tensors can be compressed; {integer} are not.")
        specs = [TensorSpec(n, tuple(t.shape), t.dtype) for n, t in state.items()]
        return cls(
            compressed=tuple(s for s in specs if s.name in compressed),
            dense=tuple(s for s in specs if s.name not in compressed),
        )

    @property
    def dense_numel(self) -> int:
        return sum(s.numel for s in self.dense)


def as_wire(data: bytes) -> dict[str, Tensor]:
    """Wraps encoded bytes as a ``ClientUpdate.payload`` (no float tensor, so finiteness checks skip it)."""
    return {WIRE_KEY: torch.frombuffer(bytearray(data), dtype=torch.uint8)}


def from_wire(payload: Mapping[str, Tensor]) -> bytes:
    """The bytes wrapped by :func:`as_wire`.

    Raises:
        PayloadError: the payload holds no encoded bytes.
    """
    wire = payload.get(WIRE_KEY)
    if wire is None or wire.dtype != torch.uint8 or wire.dim() != 1:
        raise PayloadError(f"Expected an encoded payload under {WIRE_KEY!r}; got keys {sorted(payload)[:5]}.")
    return wire.cpu().numpy().tobytes()


def pack_bits(bits: Tensor) -> Tensor:
    """Packs a boolean tensor (flattened, C order) into ``ceil(d/8)`` bytes, least-significant bit first.

    >>> pack_bits(torch.tensor([True, False, True, True, False, False, False, False, True]))
    tensor([13,  1], dtype=torch.uint8)
    """
    flat = bits.reshape(-1).to(torch.uint8)
    flat = torch.nn.functional.pad(flat, (0, (-flat.numel()) % 8))
    return (flat.view(-1, 8) * _BIT_WEIGHTS.to(flat.device)).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: Tensor, numel: int) -> Tensor:
    """Inverse of :func:`pack_bits`: the first ``numel`` bits as a flat boolean tensor.

    Raises:
        PayloadError: wrong number of bytes, or non-zero padding bits.
    """
    if packed.numel() != (numel + 7) // 8:
        raise PayloadError(f"{numel} bits need {(numel + 7) // 8} bytes, got {packed.numel()}.")
    bits = (packed.reshape(-1, 1) & _BIT_WEIGHTS.to(packed.device)).ne(0).reshape(-1)
    if bits[numel:].any():
        raise PayloadError("Non-zero padding bits after the last mask bit.")
    return bits[:numel]


def encode_bits(bits: Tensor, spec: TensorSpec) -> bytes:
    """A boolean tensor of ``spec``'s shape as its :func:`pack_bits` section (``ceil(d/8)`` bytes).

    Raises:
        ValueError: ``bits`` is not boolean or not of ``spec``'s shape.
    """
    if bits.dtype != torch.bool or tuple(bits.shape) != spec.shape:
        raise ValueError(f"Mask of {spec.name!r} must be boolean of shape {spec.shape}, got {bits.dtype} {tuple(bits.shape)}.")
    return pack_bits(bits).cpu().numpy().tobytes()


def decode_bits(section: bytes, spec: TensorSpec, device: torch.device | str) -> Tensor:
    """Inverse of :func:`encode_bits`: a boolean tensor of ``spec``'s shape on ``device``.

    Raises:
        PayloadError: wrong number of bytes, or non-zero padding bits.
    """
    packed = torch.frombuffer(bytearray(section), dtype=torch.uint8).to(device)
    return unpack_bits(packed, spec.numel).reshape(spec.shape)


def to_le_bytes(x: Tensor, dtype: str) -> bytes:
    """``x`` flattened in C order as little-endian NumPy ``dtype`` (e.g. ``"<f4"``)."""
    return x.detach().reshape(-1).cpu().numpy().astype(dtype, copy=False).tobytes()


def from_le_bytes(data: bytes, dtype: str, device: torch.device | str) -> Tensor:
    """Inverse of :func:`to_le_bytes` (a flat tensor on ``device``)."""
    return torch.from_numpy(np.frombuffer(data, dtype=dtype).copy()).to(device)


def encode_dense(tensors: Mapping[str, Tensor], specs: Iterable[TensorSpec]) -> bytes:
    """The dense section: floating-point tensors as ``float32``, integer tensors as ``int32``.

    Raises:
        ValueError: an integer value does not fit in ``int32``.
    """
    chunks = []
    for spec in specs:
        x = tensors[spec.name]
        if tuple(x.shape) != spec.shape:
            raise ValueError(f"Tensor {spec.name!r} has shape {tuple(x.shape)}, the layout says {spec.shape}.")
        if x.is_floating_point():
            chunks.append(to_le_bytes(x.float(), "<f4"))
            continue
        if x.numel() and (x.min() < -(2**31) or x.max() >= 2**31):
            raise ValueError(f"Integer tensor {spec.name!r} has values outside int32: [{x.min()}, {x.max()}].")
        chunks.append(to_le_bytes(x, "<i4"))
    return b"".join(chunks)


def decode_dense(data: bytes, specs: Iterable[TensorSpec], device: torch.device | str) -> dict[str, Tensor]:
    """Inverse of :func:`encode_dense` (``float32`` or ``int64`` tensors on ``device``)."""
    out, offset = {}, 0
    for spec in specs:
        size = 4 * spec.numel
        chunk = data[offset : offset + size]
        if len(chunk) != size:
            raise PayloadError(f"Dense section ends inside tensor {spec.name!r}.")
        flat = from_le_bytes(chunk, "<f4" if spec.dtype.is_floating_point else "<i4", device)
        out[spec.name] = (flat if spec.dtype.is_floating_point else flat.long()).reshape(spec.shape)
        offset += size
    return out


def device_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed`` (CUDA streams differ from CPU ones)."""
    return torch.Generator(device=device).manual_seed(seed)
