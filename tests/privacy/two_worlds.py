"""The two-world harness (issue 38): two federations that differ in one client, noise that is off (z = 0) or
the same draw in both worlds, and the release of one round compared with the sensitivity the accountant assumes.

Central DP (DPFedAvg, DPFedBuff) receives the client's upload, so the changed client's decoded update is
arbitrary: in the second world it points the other way with a far larger norm, and its sample count, step
count and training loss change too. What is released is the noised sum the mechanism hands on (DPFedAvg's
to the wrapped server step, DPFedBuff's buffer mean). Local DP trusts nobody, so what is released is the
client's upload itself: its payload may move by the replace-one distance 2C, and nothing else the server
computes may depend on the client (its counts or loss).
"""

from __future__ import annotations

import math
from dataclasses import replace

import lightning.pytorch as pl
import torch
from torch import nn

from fl_lightning import LinearTermMixin, MaskedNoiseMixin, ProximalMixin
from fl_lightning.algorithms import Algorithm, ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.wrapper import wrapped
from fl_lightning.privacy import DPFTRL, DPFedAvg, DPFedBuff
from fl_lightning.server.federation import Federation
from fl_lightning.utils.seeding import derive_seed

CLIP = 1.0
NUM_CLIENTS, PER_ROUND = 8, 4
SIZE, CHANGED_SIZE = 10, 1000


class _Sizes:
    """A data source of which only the clients' sizes are read."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes, self.num_clients = sizes, len(sizes)

    def client_num_samples(self, cid: int) -> int:
        return self.sizes[cid]

    def client_batches(self, cid, *, num_epochs=None, num_batches=None, generator):  # pragma: no cover - unused
        raise NotImplementedError


class _Net(ProximalMixin, LinearTermMixin, MaskedNoiseMixin, pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.bn = nn.BatchNorm1d(2)


def federation(changed: int | None = None) -> Federation:
    """The first world (``changed=None``) or the second, in which client ``changed`` holds other data."""
    torch.manual_seed(0)
    module = _Net()
    sizes = [CHANGED_SIZE if cid == changed else SIZE for cid in range(NUM_CLIENTS)]
    names = frozenset(name for name, _ in module.named_parameters())
    return Federation(data=_Sizes(sizes), module=module, clients_per_round=PER_ROUND, seed=0, param_names=names, num_rounds=1)


def _state(fed: Federation) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().float() if v.is_floating_point() else v.detach().clone() for k, v in fed.module.state_dict().items()}


def _delta(state: dict[str, torch.Tensor], cid: int, norm: float, sign: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(cid)
    raw = {k: torch.randn(v.shape, generator=g) if v.is_floating_point() else torch.zeros_like(v) for k, v in state.items()}
    size = math.sqrt(sum(float(t.square().sum()) for t in raw.values() if t.is_floating_point()))
    return {k: t * (sign * norm / size) if t.is_floating_point() else t for k, t in raw.items()}


def _update(state: dict[str, torch.Tensor], cid: int, changed: int | None) -> ClientUpdate:
    """Client ``cid``'s decoded update: norm 3 (clipped); in the second world the changed client's points the
    other way with norm 50, and its counts and loss differ."""
    other = cid == changed
    return ClientUpdate(
        client_id=cid,
        num_samples=CHANGED_SIZE if other else SIZE,
        num_steps=500 if other else 5,
        payload=_delta(state, cid, 50.0 if other else 3.0, -1.0 if other else 1.0),
        upload_bytes=0,
        metrics={"train_loss": 9.0 if other else 0.5},
    )


def _upload(algorithm: Algorithm, fed: Federation, state: dict[str, torch.Tensor], cid: int, changed: int | None) -> ClientUpdate:
    """What client ``cid`` uploads through ``algorithm``'s client side (its noise seeded alike in both worlds)."""
    plain = _update(state, cid, changed)
    context = ClientContext(
        round_idx=0,
        client_id=cid,
        num_samples=plain.num_samples,
        num_epochs=1,
        num_steps=None,
        seed=derive_seed(fed.seed, "client", 0, cid),
        completed_steps=plain.num_steps,
        metrics=dict(plain.metrics),
    )
    return algorithm.client_update(context, fed.module, plain.payload)


def _flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.double().reshape(-1) for t in state.values() if t.is_floating_point()])


def mechanism_of(algorithm: Algorithm) -> Algorithm:
    """The DP mechanism ``algorithm`` is or wraps."""
    return next(layer for layer in wrapped(algorithm) if layer.differentially_private)


def accounted_sensitivity(mechanism: Algorithm) -> float:
    """The L2 sensitivity of the release the accountant assumes (see each mechanism's docstring)."""
    if isinstance(mechanism, DPFedAvg):
        return CLIP if mechanism.sampling == "poisson" else 2 * CLIP  # add/remove-one, replace-one
    if isinstance(mechanism, DPFedBuff):
        return CLIP / mechanism.inner.buffer_size  # zero-out, on the buffer's mean
    if isinstance(mechanism, DPFTRL):
        return CLIP  # replace-with-zero, on the round's clipped sum (the tree noise, off here, is added to it)
    return 2 * CLIP  # LocalDP: replace-one of one client's data, on its upload


def _central_release(build, changed: int | None) -> tuple[list[int], torch.Tensor]:
    """The round's selection and the noised sum (DPFedAvg, DPFTRL) or buffer mean (DPFedBuff) released in a world."""
    algorithm, fed = build(), federation(changed)
    algorithm.setup(fed)
    mechanism, released = mechanism_of(algorithm), []
    if isinstance(mechanism, (DPFedAvg, DPFTRL)):
        apply = mechanism.inner.apply_weighted_sum
        mechanism.inner.apply_weighted_sum = lambda r, g, total, w: released.append(_flat(total)) or apply(r, g, total, w)
    else:
        release = mechanism.release
        mechanism.release = lambda version, payloads: released.append(_flat(out := release(version, payloads))) or out
    clients = algorithm.select_clients(0) if not algorithm.asynchronous else list(range(mechanism.inner.buffer_size))
    state = _state(fed)
    updates = [_update(state, cid, changed) for cid in clients]
    if isinstance(mechanism, DPFedAvg) and mechanism.sampling == "poisson":
        updates = [u for u in updates if u.client_id != changed]  # add/remove-one: the client is absent
    elif isinstance(mechanism, (DPFedBuff, DPFTRL)):  # zero-out / replace-with-zero: the client's updates are zero
        updates = [u if u.client_id != changed else replace(u, payload={k: torch.zeros_like(t) for k, t in u.payload.items()}) for u in updates]
    algorithm.aggregate(0, state, updates)
    return clients, released[0]


def central_shift(build) -> float:
    """How far one client moves a central mechanism's release between the two worlds (z = 0)."""
    clients, first = _central_release(build, None)
    changed = clients[0]
    again, second = _central_release(build, changed)
    assert again == clients, "the sample depends on the clients' data"
    return float((first - second).norm())


def local_shift(build) -> tuple[float, bool]:
    """LocalDP: how far the changed client's upload moves between the worlds (its noise the same draw in both),
    and whether the server's step reads nothing of it but its payload (the same step when its upload carries
    the second world's counts and loss with the first world's payload)."""

    def world(changed: int | None) -> tuple[Algorithm, dict[str, torch.Tensor], list[ClientUpdate]]:
        algorithm, fed = build(), federation(changed)
        algorithm.setup(fed)
        state = _state(fed)
        return algorithm, state, [_upload(algorithm, fed, state, cid, changed) for cid in range(PER_ROUND)]

    first, first_state, first_uploads = world(None)
    second, second_state, second_uploads = world(0)
    shift = float((_flat(first_uploads[0].payload) - _flat(second_uploads[0].payload)).norm())
    first.aggregate(0, first_state, first_uploads)
    second.aggregate(0, second_state, [replace(second_uploads[0], payload=first_uploads[0].payload), *second_uploads[1:]])
    return shift, bool(torch.equal(_flat(first_state), _flat(second_state)))
