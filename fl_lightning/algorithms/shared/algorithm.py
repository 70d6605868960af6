"""The contract between the federated loop and an FL algorithm."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import lightning.pytorch as pl
import torch

# Re-exported: the contract names all three.
from fl_lightning.algorithms.shared.client_update import TRAINING_METRICS, ClientContext, ClientUpdate  # noqa: F401
from fl_lightning.server.client_store import ClientStore
from fl_lightning.server.federated_parameters import FederatedParameters
from fl_lightning.server.federation import Federation
from fl_lightning.server.model_state import State, tensor_bytes
from fl_lightning.utils.init_args import RecordsInitArgs

if TYPE_CHECKING:
    from fl_lightning.algorithms.shared.folding import RoundFold
    from fl_lightning.robust.update_bounds import UpdateBound


class Algorithm(RecordsInitArgs, ABC):
    """Server-side logic of a synchronous federated algorithm.

    The loop calls, every round: :meth:`select_clients`; per client :meth:`plan_client` (its local work), :meth:`configure_client`
    (after loading the global weights), local training, :meth:`client_update`; then
    :meth:`aggregate`, which updates the global state in place. Subclass and override only
    what differs; see ``examples/custom_algorithm.py``.
    """

    #: Asynchronous algorithms run on the virtual-clock loop instead of synchronous rounds.
    asynchronous: ClassVar[bool] = False
    #: Round metrics that comparison studies add to their summary table, with a reduction
    #: over rounds (``"final"`` or a NumPy reduction such as ``"mean"``, ``"max"``).
    summary_metrics: ClassVar[dict[str, str]] = {}

    #: Why this algorithm's math assumes every client starts from a fresh local optimizer (zeroed
    #: momentum, no Adam moments), e.g. FedNova's ``||a_i||_1``; empty when it does not. The loop then
    #: refuses ``reset_optimizer=False`` at fit start, with this reason (:func:`check_fresh_optimizer`).
    needs_fresh_optimizer: ClassVar[str] = ""
    #: Whether this algorithm is a differential-privacy mechanism (DPFedAvg, DPFedBuff, DPFTRL, LocalDP): a wrapper that
    #: reads unnoised client values (:meth:`unnoised_client_values`) refuses to wrap one.
    differentially_private: ClassVar[bool] = False
    #: Whether this class's :meth:`configure_client` at most sets the module's loss terms (``ProximalMixin``'s centre,
    #: ``LinearTermMixin``'s direction) on the global weights, which the batched executor stacks per client
    #: (:mod:`~fl_lightning.loops.batched_terms`), or only reads the module (q-FFL's loss probe). Read from the class
    #: that defines ``configure_client`` (through an ``AlgorithmWrapper``, which passes the call on, the wrapped
    #: algorithm's), so a subclass that overrides it again must declare it again; ``Algorithm``'s own does nothing.
    configure_client_sets_terms: ClassVar[bool] = False
    #: Whether this class's :meth:`configure_client` also loads the client's own weights
    #: (``federation.load_local_weights``: Ditto's personal model), declared beside :attr:`configure_client_sets_terms`:
    #: the batched executor then copies each member's weights after its ``configure_client`` into the member's row.
    configure_client_loads_weights: ClassVar[bool] = False
    #: Why the batched executor cannot train this algorithm's clients, in one sentence: its one error when the trainer is
    #: built (or the fit starts), also when another algorithm wraps it; empty when it can or when the generic checks of
    #: :func:`~fl_lightning.loops.batched_executor.check_batched_support` say why.
    batched_refusal: ClassVar[str] = ""

    federation: Federation

    def setup(self, federation: Federation) -> None:
        """Binds the algorithm to its federation once, before the first round."""
        self.federation = federation

    def check_client_ids(self, ids: Iterable[int], entry: str) -> None:
        """Raises ``ValueError`` naming ``entry`` when per-client state loaded from a checkpoint is filed
        under an id that is not a client of this federation (a tampered or foreign checkpoint). Before
        :meth:`setup` the population is unknown and nothing is checked; the loop restores after it."""
        federation = getattr(self, "federation", None)
        if federation is None:
            return
        num_clients = federation.num_clients
        unknown = sorted(c for c in map(int, ids) if not 0 <= c < num_clients)
        if unknown:
            raise ValueError(f"`{entry}` names client {unknown[0]}, but this federation has clients 0..{num_clients - 1}")

    def client_stores(self) -> dict[str, ClientStore]:
        """The algorithm's per-client state stores, by attribute path, which the loop binds at set-up to the run
        folder, ``client_state_memory`` and client sharding (:meth:`ClientStore.bind`). By default its
        :class:`ClientStore` attributes and those of the algorithms it wraps (``inner.models``, ...)."""
        stores: dict[str, ClientStore] = {}
        for name, value in vars(self).items():
            if isinstance(value, ClientStore):
                stores[name] = value
            elif isinstance(value, Algorithm):
                stores.update({f"{name}.{path}": store for path, store in value.client_stores().items()})
        return stores

    def load_client_store(self, store: ClientStore, saved: dict[str, Any], entry: str) -> None:
        """Restores ``store`` from its :meth:`~ClientStore.state_dict` ``saved`` (filed under ``entry`` in this
        algorithm's state), after :meth:`check_client_ids` on every saved entry."""
        self.check_client_ids(saved["entries"], entry)
        store.load_state_dict(saved)

    def federated_parameters(self) -> FederatedParameters | None:
        """This algorithm's own selection of local, frozen or shared tensors (FedBN: every BatchNorm layer is
        local; FedPer: the personal head), merged with the trainer's ``federated_parameters``. None by default."""
        return None

    def overridden_settings(self) -> dict[str, str]:
        """Trainer settings the user gave (after :meth:`setup`) that this algorithm replaces, each with what
        it does instead; the loop warns once per setting, naming it. None by default."""
        return {}

    def clients_per_round_overridden(self, instead: str) -> dict[str, str]:
        """``{"clients_per_round": instead}`` for :meth:`overridden_settings` when the trainer's
        ``clients_per_round`` asks for fewer than all clients (the default, all, overrides nothing)."""
        federation = self.federation
        return {"clients_per_round": instead} if federation.clients_per_round < federation.num_clients else {}

    def select_clients(self, round_idx: int) -> list[int]:
        """Clients for this round: ``clients_per_round`` drawn uniformly without replacement."""
        fed = self.federation
        order = torch.randperm(fed.num_clients, generator=fed.generator("select", round_idx))
        return sorted(order[: fed.clients_per_round].tolist())

    def plan_client(self, client: ClientContext) -> None:
        """Decides the client's local work (``client.num_epochs`` / ``client.num_steps``, exactly one set) when its
        context is made, before any executor trains it: the batched executor groups clients by their step counts
        before it configures any. Nothing else of the run may change here; by default the trainer's local work."""

    def configure_client(self, client: ClientContext, module: pl.LightningModule, global_state: State) -> None:
        """Prepares the module for the client's local training (the global weights are already
        loaded and, with ``reset_optimizer``, the optimizer state cleared, so an algorithm may
        load a client's own weights or optimizer state here)."""

    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        """Packs what the client uploads; by default the uncompressed delta."""
        return ClientUpdate(
            client_id=client.client_id,
            num_samples=client.num_samples,
            num_steps=client.completed_steps,
            payload=delta,
            upload_bytes=tensor_bytes(delta),
            metrics=dict(client.metrics),
        )

    @property
    def uploads_deltas(self) -> bool:
        """Whether :meth:`decode_update` gives deltas ``local - global``: the trainer's ``update_bound``
        (:mod:`fl_lightning.robust.update_bounds`) needs them and is refused otherwise."""
        return True

    def check_update_bound(self, bound: UpdateBound) -> None:
        """Raises ValueError, naming both, if this algorithm cannot run under the trainer's update ``bound``."""

    def unnoised_client_values(self) -> str:
        """What this algorithm itself (not one it wraps) reads of its clients besides their uploads' payloads, in
        words: a sample or step count, a loss, a selection of its own (empty when nothing). No DP mechanism covers
        these, so one refuses to wrap, or be wrapped by, an algorithm that reads any (``docs/privacy_robustness.md``)."""
        return ""

    @property
    def hides_client_statistics(self) -> bool:
        """Whether the round's logged row leaves out the unnoised client statistics
        (:data:`~fl_lightning.loops.round_log.CLIENT_STATISTICS`): a DP mechanism's default."""
        return False

    def privacy_statement(self) -> str | None:
        """The privacy spent so far, for the progress line and the fit summary (e.g.
        ``"ε = 3.12 at δ = 1e-05 (PLD, add/remove-one)"``); None for an algorithm without a DP guarantee."""
        return None

    @property
    def aggregates_empty_rounds(self) -> bool:
        """Whether :meth:`aggregate` runs (with no updates) when none survives the loop's checks: a DP
        mechanism must release its noise then too. Otherwise such a round leaves the model unchanged."""
        return False

    @property
    def secret_sample(self) -> bool:
        """Whether the clients of a round are drawn from a secret (``DPFedAvg(secure_mode=True)``): the loop then
        neither checkpoints their ids nor keeps per-client state, which would reveal who took part."""
        return False

    @property
    def gathers_updates(self) -> bool:
        """Whether :meth:`aggregate` needs every update of the round at once but may still shard its
        clients over processes: the ranks then gather the round's decoded updates and each runs
        :meth:`aggregate` on all of them (a robust rule over a weighted sum, :mod:`fl_lightning.robust`)."""
        return False

    def decode_update(self, update: ClientUpdate) -> ClientUpdate:
        """The update as :meth:`aggregate` reads it (e.g. decompressed); by default unchanged.

        Runs on the server before the loop's checks (non-finite values, update bound).

        Raises:
            fl_lightning.compression.PayloadError: for a malformed upload, which the loop then
                rejects (``round/rejected_clients``) without touching the global model.
        """
        return update

    def replace_non_finite(self, update: ClientUpdate) -> ClientUpdate | None:
        """What the loop aggregates in place of a decoded ``update`` that is not finite (NaN/Inf values, or a
        NaN/Inf training loss): ``None`` (the default) drops it (``round/dropped_clients``); a mechanism whose
        adjacency needs every arrival counted (:class:`~fl_lightning.privacy.DPFedBuff`) returns a stand-in."""
        return None

    def download_bytes(self, global_state: State) -> int:
        """Bytes the server sends one client to start its round (the float32 global model)."""
        return tensor_bytes(global_state)

    def start_fold(self, round_idx: int, global_state: State) -> RoundFold | None:
        """A fold of this round's updates (:mod:`~fl_lightning.algorithms.shared.folding`) that gives :meth:`aggregate`'s
        bits without holding every update at once; ``None`` (the default) when the aggregation reads them all together."""
        return None

    @abstractmethod
    def aggregate(self, round_idx: int, global_state: State, updates: list[ClientUpdate]) -> dict[str, float]:
        """Updates ``global_state`` in place from the round's (finite) updates.

        Returns:
            Extra round-level metrics to log (may be empty).
        """

    def evaluate(self, round_idx: int, module: pl.LightningModule) -> dict[str, float]:
        """Server-side evaluation of the new global model (loaded in ``module``), before the
        validation loop; returns extra round metrics (e.g. accuracy on a priority distribution)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Server state to checkpoint (besides the global weights)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`; raises :class:`~fl_lightning.utils.saved_state.InvalidStateError` naming
        the entry when the state holds a value no run can produce."""

    def check_restored(self, rounds_done: int) -> None:
        """After :meth:`load_state_dict` on a resume: checks the restored state against the ``rounds_done``
        rounds (aggregations) the checkpoint records, raising
        :class:`~fl_lightning.utils.saved_state.InvalidStateError` naming what does not match."""


def check_fresh_optimizer(algorithm: Algorithm, reset_optimizer: bool) -> None:
    """Raises ``ValueError`` naming the algorithm and ``reset_optimizer=False`` when the algorithm
    declares :attr:`Algorithm.needs_fresh_optimizer` and the optimizer state is carried from client to client."""
    reason = algorithm.needs_fresh_optimizer
    if not reset_optimizer and reason:
        raise ValueError(
            f"{type(algorithm).__name__} refuses reset_optimizer=False: {reason}, but reset_optimizer=False carries "
            "the previous client's optimizer state (momentum, moments) into every client. Use reset_optimizer=True."
        )
