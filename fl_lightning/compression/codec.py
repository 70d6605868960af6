"""The codec contract: exact payload sizes, header validation and decoding to dense deltas."""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from fl_lightning.compression.wire import (
    MAGIC,
    PREFIX,
    VERSION,
    Layout,
    PayloadError,
    TensorSpec,
    decode_dense,
    encode_dense,
)
from fl_lightning.server.model_state import State
from fl_lightning.utils.init_args import RecordsInitArgs


class Codec(RecordsInitArgs, ABC):
    """Turns a client's upload into bytes and back into a dense delta for every state tensor.

    A payload is ``prefix | header fields | one fixed-size section per compressed tensor |
    dense section`` (see :mod:`fl_lightning.compression.wire`), so its size is a function of
    the :class:`~fl_lightning.compression.wire.Layout` alone: :meth:`payload_size`.
    """

    #: Identifies the codec in the payload prefix.
    codec_id: ClassVar[int]
    #: The codec's own header fields after the prefix (none by default).
    header_fields: ClassVar[struct.Struct] = struct.Struct("<")

    @property
    def header_size(self) -> int:
        """Bytes before the first tensor section."""
        return PREFIX.size + self.header_fields.size

    @abstractmethod
    def section_size(self, spec: TensorSpec) -> int:
        """Bytes of one compressed tensor's section."""

    def payload_size(self, layout: Layout) -> int:
        """Exact payload bytes: header + compressed sections + 4 bytes per dense element."""
        return self.header_size + sum(self.section_size(s) for s in layout.compressed) + 4 * layout.dense_numel

    def pack(
        self, fields: Sequence[Any], sections: Sequence[bytes], dense: Mapping[str, Tensor], layout: Layout
    ) -> bytes:
        """Assembles a payload; checks every section against :meth:`section_size`."""
        for spec, section in zip(layout.compressed, sections, strict=True):
            if len(section) != self.section_size(spec):
                raise ValueError(f"Section of {spec.name!r} has {len(section)} bytes, expected {self.section_size(spec)}.")
        head = PREFIX.pack(MAGIC, VERSION, self.codec_id) + self.header_fields.pack(*fields)
        return head + b"".join(sections) + encode_dense(dense, layout.dense)

    def decode(self, payload: bytes, layout: Layout, *, device: torch.device | str = "cpu") -> State:
        """The dense delta of every tensor in ``layout`` (``float32``; integer tensors ``int64``).

        Raises:
            PayloadError: truncated or over-long payload, bad magic, unknown version, another
                codec's payload, header fields that disagree with this codec, invalid content.
        """
        if len(payload) < self.header_size:
            raise PayloadError(f"Payload of {len(payload)} bytes is shorter than the {self.header_size}-byte header.")
        magic, version, codec_id = PREFIX.unpack_from(payload)
        if magic != MAGIC:
            raise PayloadError(f"Bad magic {magic!r}, expected {MAGIC!r}: not an fl_lightning payload.")
        if version != VERSION:
            raise PayloadError(f"Unknown payload version {version}; this decoder reads version {VERSION}.")
        if codec_id != self.codec_id:
            raise PayloadError(f"Payload was written by codec id {codec_id}, not {type(self).__name__} (id {self.codec_id}).")
        expected = self.payload_size(layout)
        if len(payload) != expected:
            raise PayloadError(f"Payload has {len(payload)} bytes; this model's layout needs exactly {expected}.")
        fields = self.header_fields.unpack_from(payload, PREFIX.size)
        offset, sections = self.header_size, []
        for spec in layout.compressed:
            size = self.section_size(spec)
            sections.append(payload[offset : offset + size])
            offset += size
        out = self.decode_sections(fields, sections, layout.compressed, device)
        out.update(decode_dense(payload[offset:], layout.dense, device))
        return out

    @abstractmethod
    def decode_sections(
        self, fields: tuple[Any, ...], sections: Sequence[bytes], specs: Sequence[TensorSpec], device: torch.device | str
    ) -> State:
        """Dense ``float32`` deltas of the compressed tensors from their sections."""


class UpdateCodec(Codec):
    """A codec that compresses a dense delta tensor by tensor (SignSGD, Top-k, TernGrad)."""

    def encode(self, delta: Mapping[str, Tensor], layout: Layout, *, generator: torch.Generator | None = None) -> bytes:
        """Payload of ``delta``; stochastic codecs draw from ``generator`` (on the delta's device)."""
        sections = [self.encode_tensor(delta[s.name].detach().float(), generator) for s in layout.compressed]
        return self.pack((), sections, delta, layout)

    def decode_sections(
        self, fields: tuple[Any, ...], sections: Sequence[bytes], specs: Sequence[TensorSpec], device: torch.device | str
    ) -> State:
        return {s.name: self.decode_tensor(section, s, device).reshape(s.shape) for s, section in zip(specs, sections)}

    @abstractmethod
    def encode_tensor(self, x: Tensor, generator: torch.Generator | None) -> bytes:
        """Section bytes of one tensor."""

    @abstractmethod
    def decode_tensor(self, section: bytes, spec: TensorSpec, device: torch.device | str) -> Tensor:
        """The tensor's (flat or shaped) ``float32`` reconstruction from its section."""
