"""FedAvg over compressed uploads: clients encode with a codec, the server decodes and averages."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import lightning.pytorch as pl
from typing_extensions import override

from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.combinable import Combine, apply_combined
from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.algorithms.shared.server_optimizers import ServerOptimizer
from fl_lightning.compression.codec import Codec, UpdateCodec
from fl_lightning.compression.wire import Layout, as_wire, device_generator, from_wire
from fl_lightning.server.federation import Federation
from fl_lightning.mixins.masked_noise import default_maskable_names
from fl_lightning.server.model_state import State
from fl_lightning.utils.seeding import derive_seed


class CompressedFedAvg(FedAvg):
    r"""FedAvg whose clients upload ``codec``-encoded deltas (SignSGD, Top-k, TernGrad baselines).

    Client: the delta of every *compressible* tensor (:meth:`compressible_names`: Conv/Linear
    weights, or the module's ``maskable_parameter_names()``) is compressed, every other tensor is
    sent in full precision; ``upload_bytes`` is the payload's exact length. Server: each payload
    is decoded to a dense delta (:meth:`decode_update`) and the decoded deltas are averaged as in
    :class:`FedAvg` (sample-count weights, server optimizer). The loop rejects a payload that fails
    to decode (wrong length, bad header, unknown version, invalid content; ``round/rejected_clients``)
    and drops one that decodes to non-finite values (``round/dropped_clients``), with a warning;
    decoding happens before the global state is touched, so it never changes the model.
    Stochastic codecs draw from a generator seeded by ``(client seed, "compress")``.

    Args:
        codec: e.g. ``StochasticSignCodec()``, ``TopKCodec(density=0.03)``, ``TernGradCodec()``.
        server_optimizer: as in :class:`FedAvg`.
        weighting: as in :class:`FedAvg`.
    """

    layout: Layout

    def __init__(
        self,
        *,
        codec: Codec,
        server_optimizer: ServerOptimizer | None = None,
        weighting: Literal["samples", "uniform"] = "samples",
    ) -> None:
        if not isinstance(codec, Codec):
            raise TypeError(f"`codec` must be a fl_lightning.compression.Codec, got {type(codec).__name__}.")
        super().__init__(server_optimizer=server_optimizer, weighting=weighting)
        self.codec = codec

    def setup(self, federation: Federation) -> None:
        super().setup(federation)
        module = federation.module
        uploaded, compressible = self.uploaded_tensors(module), self.compressible_names(module)
        unsent = [name for name in compressible if name not in uploaded]
        if unsent and federation.kinds is not None:
            raise ValueError(
                f"{type(self).__name__} would compress {unsent}, but only the shared tensors are sent and `{unsent[0]}` "
                f"is {federation.kinds.describe(unsent[0])} (federated_parameters): name shared tensors only (the "
                "module's maskable_parameter_names() picks trainable weights by default)."
            )
        self.layout = Layout.from_state(uploaded, compressible)

    def uploaded_tensors(self, module: pl.LightningModule) -> State:
        """The state tensors a client's upload covers (default: the shared ones, ``Federation.local_weights``)."""
        return self.federation.local_weights()

    def compressible_names(self, module: pl.LightningModule) -> list[str]:
        """Tensors to compress: the module's ``maskable_parameter_names()`` if it has one, else Conv/Linear weights."""
        names = getattr(module, "maskable_parameter_names", None)
        return list(names()) if callable(names) else default_maskable_names(module)

    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        data = self.encode(client, module, delta)
        return ClientUpdate(
            client_id=client.client_id,
            num_samples=client.num_samples,
            num_steps=client.completed_steps,
            payload=as_wire(data),
            upload_bytes=len(data),
            metrics=dict(client.metrics),
        )

    def encode(self, client: ClientContext, module: pl.LightningModule, delta: State) -> bytes:
        """The client's payload; by default ``codec.encode(delta)``."""
        if not isinstance(self.codec, UpdateCodec):
            raise TypeError(f"{type(self.codec).__name__} does not compress dense deltas; use its own algorithm.")
        generator = device_generator(derive_seed(client.seed, "compress"), module.device)
        return self.codec.encode(delta, self.layout, generator=generator)

    def decode_update(self, update: ClientUpdate) -> ClientUpdate:
        """The update with its payload decoded to a dense delta on the module's device.

        Raises:
            PayloadError: the payload is malformed (the loop rejects the update).
        """
        delta = self.codec.decode(from_wire(update.payload), self.layout, device=self.federation.module.device)
        return replace(update, payload=delta)

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        """Aggregates decoded updates (:meth:`decode_update`) with :meth:`aggregate_decoded`."""
        return {**self.aggregate_decoded(round_idx, global_state, updates), **self.report_metrics(updates)}

    @property
    @override
    def summable(self) -> bool:
        """Whether the aggregation is FedAvg's weighted sum of the decoded deltas (:meth:`aggregate` and
        :meth:`aggregate_decoded` not overridden): then clients shard over processes, each rank decoding
        and summing the uploads of the clients it trained (FedMRN, FedMRNS, FedAvgSM, any codec; not FedPM)."""
        return self.combinable and type(self).aggregate is CompressedFedAvg.aggregate

    @property
    def combinable(self) -> bool:
        """Whether the decoded updates are averaged as deltas (:meth:`aggregate_decoded` not overridden),
        so a robust rule may replace the average (:class:`~fl_lightning.algorithms.shared.combinable.SupportsCombine`)."""
        return type(self).aggregate_decoded is CompressedFedAvg.aggregate_decoded

    def combine_group(self) -> tuple[str, int]:
        """The round: all decoded deltas form one group."""
        return "clients_per_round", self.federation.clients_per_round

    def aggregate_with(self, round_idx: int, global_state: State, updates: list[ClientUpdate], combine: Combine) -> dict[str, float]:
        """The server step applied to ``combine`` of the decoded deltas instead of their weighted mean."""
        return {**apply_combined(self, round_idx, global_state, updates, combine), **self.report_metrics(updates)}

    @override
    def report_metrics(self, reports: list[ClientUpdate]) -> dict[str, float]:
        """``payload_bytes``: the mean upload of the aggregated clients; ``compression_ratio``: dense over payload bytes."""
        return {
            "payload_bytes": sum(u.upload_bytes for u in reports) / max(len(reports), 1),
            "compression_ratio": self.dense_bytes() / self.codec.payload_size(self.layout),
        }

    def aggregate_decoded(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        """Aggregates updates whose payloads are decoded (by default dense deltas, averaged as FedAvg)."""
        total, weight = self.weighted_delta_sum(updates)
        return self.apply_weighted_sum(round_idx, global_state, total, weight)

    def dense_bytes(self) -> int:
        """Bytes of the same upload uncompressed (4 bytes per element)."""
        return 4 * sum(s.numel for s in (*self.layout.compressed, *self.layout.dense))
