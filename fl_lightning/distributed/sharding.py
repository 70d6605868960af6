"""Clients sharded over processes, combined with one all-reduce per round."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass

import torch
from lightning.pytorch.strategies import Strategy

from fl_lightning.algorithms.shared.aggregation import accumulator_dtype
from fl_lightning.algorithms.shared.algorithm import TRAINING_METRICS, ClientUpdate
from fl_lightning.server.model_state import State

#: Per-client scalars that travel in the round's all-reduce (one row per selected client).
_COUNT_FIELDS = ("trained", "dropped", "rejected", "num_samples", "num_steps", "upload_bytes")
#: After the counts, each training metric takes two fields: whether the client reported it, and its value.
_REPORT_FIELDS = _COUNT_FIELDS + tuple(f for key in TRAINING_METRICS for f in (f"has_{key}", key))


class PeerFailureError(RuntimeError):
    """A round's collective failed: another process hung (past the strategy's ``timeout``) or died."""


@dataclass
class ShardedRound:
    """The round as every rank sees it after the all-reduce.

    Attributes:
        total: :math:`\\sum_k w_k \\Delta_k` over every rank's finite updates, in the accumulator dtypes.
        weight: :math:`\\sum_k w_k` over the same updates.
        reports: one payload-free :class:`ClientUpdate` per selected client, in selection order.
        aggregated: the reports of the clients whose update is in ``total`` (neither dropped nor rejected).
        dropped: clients whose update was non-finite (and is not in ``total``).
        rejected: clients whose update was malformed or refused by the update bound (not in ``total``).
        stop: whether any rank received SIGTERM.
    """

    total: State
    weight: float
    reports: list[ClientUpdate]
    aggregated: list[ClientUpdate]
    dropped: int
    rejected: int
    stop: bool


def shard(clients: list[int], rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s share of a round's clients: every ``world_size``-th, in selection order."""
    return clients[rank::world_size]


class ClientSharding:
    """Splits each round's clients over the ranks and sums their weighted deltas with one all-reduce.

    Rank ``r`` of ``N`` trains ``clients[r::N]``, a deterministic and disjoint share; every
    client keeps the data seed it has in a single process, so each update is the same as
    there. The partial sums :math:`\\sum_k w_k \\Delta_k`, :math:`\\sum_k w_k`, the clients'
    scalar reports and the SIGTERM flag are packed into one float64 buffer and summed by a
    single all-reduce; the algorithm's server step then runs identically on every rank.

    With ``by_owner`` (an algorithm with per-client state, :meth:`~fl_lightning.Algorithm.client_stores`),
    rank ``r`` trains the round's clients whose id is ``r`` modulo ``N`` instead: a client always trains on
    the same rank, whose store alone holds its state.

    Args:
        strategy: the trainer's (DDP) strategy, which owns the process group.
        by_owner: shard by owner rank (client id modulo the world size) rather than by position.
    """

    def __init__(self, strategy: Strategy, *, by_owner: bool = False) -> None:
        self.strategy = strategy
        self.by_owner = by_owner

    @property
    def rank(self) -> int:
        return self.strategy.global_rank

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    def share(self, clients: list[int]) -> list[int]:
        """This rank's clients of the round, in selection order."""
        return [c for c in clients if self.owns(c)] if self.by_owner else shard(clients, self.rank, self.world_size)

    def owns(self, client_id: int) -> bool:
        """Whether client ``client_id`` trains on this rank whenever it is selected (``by_owner`` sharding)."""
        return client_id % self.world_size == self.rank

    def gather_entries(self, entries: dict[int, State]) -> dict[int, State]:
        """Every rank's per-client ``entries`` merged on rank 0 (this rank's own elsewhere), for a checkpoint,
        which rank 0 writes; a collective, so every rank calls it when the checkpoint is taken."""
        gathered: list[dict[int, State]] | None = [{} for _ in range(self.world_size)] if self.rank == 0 else None
        try:
            torch.distributed.gather_object(entries, gathered, dst=0)
        except RuntimeError as err:
            raise PeerFailureError(f"Rank {self.rank}: gathering the per-client state for a checkpoint failed ({err}).") from err
        return entries if gathered is None else dict(sorted((cid, s) for part in gathered for cid, s in part.items()))

    def all_reduce(
        self,
        clients: list[int],
        local: list[ClientUpdate],
        dropped_ids: set[int],
        partial: tuple[State, float],
        template: State,
        *,
        stop: bool,
        rejected_ids: Set[int] = frozenset(),
    ) -> ShardedRound:
        """Combines this rank's updates (``local``) and partial sum with every other rank's.

        Args:
            clients: the round's selected clients (the same list on every rank).
            local: this rank's updates, finite or not.
            dropped_ids: this rank's clients whose update is non-finite (excluded from ``partial``).
            partial: this rank's ``(sum of weighted deltas, sum of weights)``; an empty state if none.
            template: the global state, for names, shapes and dtypes.
            stop: whether this rank received SIGTERM.
            rejected_ids: this rank's clients whose update was rejected (excluded from ``partial``).
        """
        device = self.strategy.root_device
        total, weight = partial
        unknown = sorted(set(total) - set(template))
        if unknown:  # the buffer carries the global state's tensors only: these would be lost on every rank
            raise RuntimeError(
                f"The round's weighted sum has tensors {unknown} that the global model lacks; client sharding sums only "
                "the global model's tensors. An algorithm that sums more must not shard (override `summable`)."
            )
        reports = torch.zeros(len(clients), len(_REPORT_FIELDS), dtype=torch.float64)
        row_of = {cid: i for i, cid in enumerate(clients)}
        for update in local:
            counts = [
                1.0, float(update.client_id in dropped_ids), float(update.client_id in rejected_ids),
                update.num_samples, update.num_steps, update.upload_bytes,
            ]  # fmt: skip
            metrics = [f for key in TRAINING_METRICS for f in (float(key in update.metrics), update.metrics.get(key, 0.0))]
            reports[row_of[update.client_id]] = torch.tensor(counts + metrics, dtype=torch.float64)
        parts = [
            (total[name] if name in total else torch.zeros_like(t)).reshape(-1).to(device, torch.float64)
            for name, t in template.items()
        ]
        scalars = torch.tensor([weight, float(stop)], dtype=torch.float64)
        buffer = torch.cat([*parts, reports.reshape(-1).to(device), scalars.to(device)])
        buffer = self._sum(buffer)  # the round's one collective
        return self._unpack(buffer.cpu(), clients, template)

    def _sum(self, buffer: torch.Tensor) -> torch.Tensor:
        """``buffer`` summed over the processes; a hung or dead peer is one :class:`PeerFailureError`."""
        try:
            return self.strategy.reduce(buffer, reduce_op="sum")
        except RuntimeError as err:  # torch's DistBackendError, gloo's timeouts and resets
            timeout = getattr(self.strategy, "_timeout", None)
            raise PeerFailureError(
                f"Rank {self.rank}: a round's all-reduce failed, most likely because another process hung or died "
                f"(a process waits {timeout} for the others: FederatedDDPStrategy(timeout=...)). The last round's "
                f"checkpoint is intact: resume with ckpt_path='last'. ({type(err).__name__}: {err})"
            ) from err

    @staticmethod
    def _unpack(buffer: torch.Tensor, clients: list[int], template: State) -> ShardedRound:
        total = _unflatten(buffer, template, lambda t: accumulator_dtype(t.dtype))
        offset = sum(t.numel() for t in template.values())
        reports = buffer[offset : offset + len(clients) * len(_REPORT_FIELDS)].view(len(clients), -1)
        weight, stop = buffer[-2:].tolist()
        if not torch.equal(reports[:, 0], torch.ones(len(clients), dtype=torch.float64)):
            raise RuntimeError(f"Client sharding lost or duplicated clients: trained counts {reports[:, 0].tolist()}.")
        received = [
            ClientUpdate(
                client_id=cid,
                num_samples=int(row[3]),
                num_steps=int(row[4]),
                payload={},
                upload_bytes=int(row[5]),
                metrics=_reported_metrics(row[len(_COUNT_FIELDS) :]),
            )
            for cid, row in zip(clients, reports.tolist())
        ]
        kept = (reports[:, 1] + reports[:, 2] == 0).tolist()
        aggregated = [update for update, keep in zip(received, kept) if keep]
        dropped, rejected = int(reports[:, 1].sum()), int(reports[:, 2].sum())
        return ShardedRound(total, weight, received, aggregated, dropped=dropped, rejected=rejected, stop=stop > 0)

    def gather_payloads(self, clients: list[int], updates: list[ClientUpdate], template: State) -> dict[int, State]:
        """Every rank's decoded payloads (``updates``: this rank's), by client, on every rank, by one
        all-reduce of a ``(clients, 1 + d)`` float64 matrix in which each client's row is filled by the
        one rank that trained it; tensors come back in ``template``'s dtypes (exact for float32 and
        float64 values and for integer counters below 2**53)."""
        size = sum(t.numel() for t in template.values())
        buffer = torch.zeros(len(clients), 1 + size, dtype=torch.float64)
        row_of = {cid: i for i, cid in enumerate(clients)}
        for update in updates:
            flat = [update.payload[name].reshape(-1).to("cpu", torch.float64) for name in template]
            buffer[row_of[update.client_id]] = torch.cat([torch.ones(1, dtype=torch.float64), *flat])
        buffer = self._sum(buffer.to(self.strategy.root_device)).cpu()
        return {cid: _unflatten(row[1:], template, lambda t: t.dtype) for cid, row in zip(clients, buffer) if row[0] > 0}

    def sum_residues(self, residues: torch.Tensor) -> torch.Tensor:
        """Every rank's int64 ``residues`` added by one all-reduce (wrapping mod 2**64, so any sum mod
        2**b with b <= 64 is exact): secure aggregation's masked sums."""
        return self.sum_tensor(residues)

    def sum_tensor(self, values: torch.Tensor) -> torch.Tensor:
        """Every rank's ``values`` added by one all-reduce, on the CPU (a collective: every rank calls it)."""
        return self._sum(values.to(self.strategy.root_device)).cpu()

    def gather_norms(self, clients: list[int], norms: Mapping[int, float]) -> dict[int, float]:
        """Every rank's update norms (``norms``: this rank's, by client), in selection order, by one
        small all-reduce; for an update bound that compares a round's updates."""
        buffer = torch.zeros(2, len(clients), dtype=torch.float64)
        for i, cid in enumerate(clients):
            if cid in norms:
                buffer[:, i] = torch.tensor([1.0, norms[cid]], dtype=torch.float64)
        buffer = self._sum(buffer.to(self.strategy.root_device)).cpu()
        return {cid: float(buffer[1, i]) for i, cid in enumerate(clients) if buffer[0, i] > 0}


def _reported_metrics(fields: list[float]) -> dict[str, float]:
    """The training metrics a client reported, from its ``(has, value)`` report fields."""
    return {key: fields[2 * i + 1] for i, key in enumerate(TRAINING_METRICS) if fields[2 * i]}


def _unflatten(vector: torch.Tensor, template: State, dtype: Callable[[torch.Tensor], torch.dtype]) -> State:
    """The start of ``vector`` cut into ``template``'s shapes, on its devices, each tensor in ``dtype(template tensor)``."""
    out, offset = {}, 0
    for name, t in template.items():
        out[name] = vector[offset : offset + t.numel()].view(t.shape).to(t.device, dtype(t))
        offset += t.numel()
    return out
