"""Simulated secure aggregation: the server learns only the sum of the round's weighted deltas."""

from __future__ import annotations

import math
from collections.abc import Set
from dataclasses import replace

import lightning.pytorch as pl
import torch
from torch import Tensor
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

from fl_lightning.algorithms.shared.aggregation import accumulator_dtype
from fl_lightning.algorithms.shared.algorithm import Algorithm, ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.summable import SummableAggregation
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper
from fl_lightning.server.model_state import State, all_finite
from fl_lightning.secure.masking import decode, encode, masked

#: Protocol messages a client uploads besides its masked vector (Bonawitz et al. 2017, Fig. 4):
#: two X25519 public keys, and to each peer an encrypted pair of Shamir shares (two 32-byte
#: shares and a 16-byte AES-GCM tag).
PUBLIC_KEYS_BYTES = 2 * 32
SHARES_BYTES_PER_PEER = 2 * 32 + 16
#: The payload key of a client that withholds its masked vector because its delta or weight is not finite.
WITHHELD = "withheld_non_finite"


class SecureAggregation(AlgorithmWrapper):
    r"""Pairwise-masked secure aggregation (Bonawitz et al. 2017, §4), simulated, around a
    weighted-sum algorithm.

    Client :math:`k` uploads its weighted delta and weight, :math:`(w_k\Delta_k, w_k)`, in
    ``modulus_bits``-bit fixed point with ``fraction_bits`` fraction bits
    (:mod:`fl_lightning.secure.masking`), plus a one-time pad for every other client of the round
    that cancels in the sum. Each value is checked before masking so that the sum over the round's
    :math:`n` clients fits the ring (:math:`n|x| < 2^{b-1-f}`); a client whose value does not fit stops
    the fit with an ``OverflowError`` naming the value and the settings, as the modular sum would
    otherwise wrap silently. A client whose weighted delta or weight is not finite (NaN/Inf) withholds its
    masked vector (its upload is a NaN marker, :data:`WITHHELD`): the loop drops it as non-finite and counts
    it in ``round/dropped_clients``, as it drops a plain FedAvg client's NaN update, and the server recovers
    its pads like a dropout's (before issue 38 NaN encoded to 0 and was aggregated at full weight, and Inf
    stopped the fit with ``OverflowError``). A fraction
    ``dropout`` of the round's clients (drawn from ``(seed, "secagg_dropout", round, client)``)
    drop after training and before their upload arrives, as do clients the loop rejects; the
    server then removes the survivors' pads with the dropped clients (in the protocol, rebuilt from
    the survivors' Shamir shares: the recovery round) if at least ``min_survivors`` of the round's
    clients arrived, and otherwise aborts the round (global model unchanged). The unmasked sum
    goes to the wrapped algorithm's server step: FedAvg within the quantisation error
    :math:`n\,2^{-f-1}` per coordinate of the sum.

    ``upload_bytes`` counts the masked vector (``modulus_bits`` per value) and the protocol's key
    and share messages (:data:`PUBLIC_KEYS_BYTES`, :data:`SHARES_BYTES_PER_PEER` per peer); the
    recovery round's messages are not counted.

    Simulated, not secure: the pads are seeded from the run's (logged) seed, so whoever knows it can
    remove them and read every upload; the self-masks that protect against a server lying about
    dropouts are omitted. What it measures is the protocol's numerics (quantisation, overflow,
    dropout recovery) and its bytes. Sent in the clear beside the masked vector, as in the loop's
    other algorithms: each client's ``num_samples``, ``num_steps`` and training metrics (its loss),
    which the round's logs report; only the weighted delta and its weight are masked. The server
    step sees no individual update, so an ``update_bound`` is refused. Under client
    sharding (``strategy="ddp"``) each rank sums its clients' masked vectors (:meth:`masked_sum`), one
    int64 all-reduce adds the ranks' sums (the pads between clients of different ranks cancel there,
    mod :math:`2^b`, as int64 wraps mod :math:`2^{64}`), and every rank unmasks the same sum.

    Args:
        algorithm: a :class:`~fl_lightning.SummableAggregation` (default :class:`FedAvg`).
        modulus_bits: :math:`b`, the bits of the ring :math:`\mathbb Z_{2^b}`, in 8..62.
        fraction_bits: :math:`f`, in 0..b-2.
        dropout: probability that a client drops before its upload arrives, in [0, 1).
        min_survivors: fraction of the round's clients needed for the recovery, in (0, 1].
    """

    def __init__(
        self,
        *,
        algorithm: Algorithm | None = None,
        modulus_bits: int = 48,
        fraction_bits: int = 20,
        dropout: float = 0.0,
        min_survivors: float = 0.5,
    ) -> None:
        super().__init__(algorithm)
        if not isinstance(self.inner, SummableAggregation) or not self.inner.summable:
            raise ValueError(
                "SecureAggregation reveals only the sum of the clients' weighted deltas, so it needs an algorithm whose "
                f"aggregation is that sum (SummableAggregation: FedAvg, FedProx, their server optimizers); "
                f"{type(self.inner).__name__}'s payload is not a sum."
            )
        if type(self.inner).decode_update is not Algorithm.decode_update:
            raise ValueError(
                "Secure aggregation masks each client's delta in fixed point, but "
                f"{type(self.inner).__name__} uploads an encoded payload that the server decodes (decode_update); "
                "wrap an algorithm that uploads its plain delta (FedAvg, FedProx, their server optimizers)."
            )
        if not 8 <= modulus_bits <= 62:
            raise ValueError(f"`modulus_bits` must be in 8..62 (int64 sums of two residues), got {modulus_bits!r}.")
        if not 0 <= fraction_bits <= modulus_bits - 2:
            raise ValueError(f"`fraction_bits` must be in 0..{modulus_bits - 2}, got {fraction_bits!r}.")
        if not 0 <= dropout < 1:
            raise ValueError(f"`dropout` must be in [0, 1), got {dropout!r}.")
        if not 0 < min_survivors <= 1:
            raise ValueError(f"`min_survivors` must be in (0, 1], got {min_survivors!r}.")
        self.modulus_bits, self.fraction_bits = modulus_bits, fraction_bits
        self.dropout, self.min_survivors = float(dropout), float(min_survivors)
        self.round_clients: list[int] = []

    @override
    def select_clients(self, round_idx: int) -> list[int]:
        """The wrapped algorithm's choice; the clients learn who their peers are (for the pads)."""
        self.round_clients = list(self.inner.select_clients(round_idx))
        return self.round_clients

    @override
    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        """The masked fixed-point vector :math:`(w_k\\Delta_k, w_k)` and its wire size."""
        plain = self.inner.client_update(client, module, delta)
        weight = self.inner.aggregation_weight(plain)
        peers = len(self.round_clients) - 1
        if not (all_finite(plain.payload) and math.isfinite(weight)):
            # NaN would pass the range check and encode to 0 (a full-weight zero delta), Inf would raise OverflowError
            # and stop the fit: the client withholds its masked vector instead, so the loop drops it as non-finite
            # (as it drops a plain NaN update) and the server recovers its pads like a dropout's.
            return replace(plain, payload={WITHHELD: torch.tensor(math.nan)}, upload_bytes=PUBLIC_KEYS_BYTES + peers * SHARES_BYTES_PER_PEER)
        vector = torch.cat(
            [
                *(t.detach().cpu().double().reshape(-1) * weight for t in plain.payload.values()),
                torch.tensor([weight], dtype=torch.float64),
            ]
        )
        residues = encode(vector, self.modulus_bits, self.fraction_bits, summands=len(self.round_clients))
        pads = masked(residues, client.client_id, self.round_clients, self.federation.seed, client.round_idx, self.modulus_bits)
        wire = math.ceil(self.modulus_bits * len(vector) / 8) + PUBLIC_KEYS_BYTES + peers * SHARES_BYTES_PER_PEER
        return replace(plain, payload={"masked": pads}, upload_bytes=wire)

    @property
    @override
    def uploads_deltas(self) -> bool:
        return False

    def drops(self, round_idx: int, client_id: int) -> bool:
        """Whether the client's upload is lost in this round (simulated dropout)."""
        if self.dropout == 0:
            return False
        generator = self.federation.generator("secagg_dropout", round_idx, client_id)
        return torch.rand((), generator=generator, dtype=torch.float64).item() < self.dropout

    @override
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        """Sums the arrived masked vectors, removes the pads shared with dropped clients, and applies the sum."""
        dropped = self.dropped_clients(round_idx, absent=set(self.round_clients) - {u.client_id for u in updates})
        return self.apply_masked_sum(round_idx, global_state, self.masked_sum(round_idx, updates, dropped, global_state), dropped)

    def dropped_clients(self, round_idx: int, absent: Set[int] = frozenset()) -> list[int]:
        """The round's clients whose upload did not arrive: the simulated dropouts and ``absent``."""
        return [c for c in self.round_clients if c in absent or self.drops(round_idx, c)]

    def masked_sum(self, round_idx: int, updates: list[ClientUpdate], dropped: list[int], global_state: State) -> Tensor:
        """The masked vectors of ``updates`` not in ``dropped``, summed mod :math:`2^b`, less the pads each
        shares with a dropped client (the recovery). Additive over any split of the clients: with client
        sharding each rank sums its own and the ranks' sums are added mod :math:`2^b`, where the pads
        between clients of different ranks cancel."""
        modulus = 1 << self.modulus_bits
        total = torch.zeros(sum(t.numel() for t in global_state.values()) + 1, dtype=torch.int64)
        for update in updates:
            if update.client_id in dropped:
                continue
            total = (total + update.payload["masked"]) % modulus
            # Recovery: the pads this survivor shares with dropped clients, rebuilt and removed.
            pads = masked(torch.zeros_like(total), update.client_id, dropped, self.federation.seed, round_idx, self.modulus_bits)
            total = (total - pads) % modulus
        return total

    def apply_masked_sum(self, round_idx: int, global_state: State, total: Tensor, dropped: list[int]) -> dict[str, float]:
        """Unmasks ``total`` (a sum of :meth:`masked_sum` results) and hands the sum to the wrapped server step,
        unless fewer than ``min_survivors`` of the round arrived (then the round aborts)."""
        arrived = len(self.round_clients) - len(dropped)
        metrics = {"secagg_dropped_clients": float(len(dropped))}
        if arrived < math.ceil(self.min_survivors * len(self.round_clients)):
            rank_zero_warn(
                f"Round {round_idx}: secure aggregation aborted: {arrived} of {len(self.round_clients)} clients "
                f"arrived, fewer than min_survivors={self.min_survivors}; the global model is unchanged."
            )
            return metrics
        values, offset, summed = decode(total % (1 << self.modulus_bits), self.modulus_bits, self.fraction_bits), 0, {}
        for name, like in global_state.items():
            summed[name] = values[offset : offset + like.numel()].view(like.shape).to(like.device, accumulator_dtype(like.dtype))
            offset += like.numel()
        return {**self.inner.apply_weighted_sum(round_idx, global_state, summed, float(values[-1])), **metrics}

    @property
    @override
    def summable(self) -> bool:
        """Never: the masked sum is modular, not the float all-reduce of client sharding."""
        return False
