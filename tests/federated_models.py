"""Small models for the "what is federated" tests (issue 37): a frozen base under a trainable adapter, and a
model with tied weights (an embedding that is also the output layer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.mixins import LinearTermMixin, MaskedNoiseMixin, MixtureWeightedMixin, ProbabilityMaskMixin, ProximalMixin
from fl_lightning.models import ClassificationModule, LogisticRegression

#: The frozen base (a Linear and a BatchNorm whose parameters do not require grad), its buffers included.
FROZEN = (
    "net.base.weight",
    "net.base.bias",
    "net.norm.weight",
    "net.norm.bias",
    "net.norm.running_mean",
    "net.norm.running_var",
    "net.norm.num_batches_tracked",
)
#: What the clients train and send: the residual adapter and the head.
SHARED = ("net.adapter.weight", "net.adapter.bias", "net.head.weight", "net.head.bias")


class AdapterNet(nn.Module):
    """3 features -> base Linear -> BatchNorm -> residual tanh adapter -> head over 2 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.base = nn.Linear(3, 3)
        self.norm = nn.BatchNorm1d(3)
        self.adapter = nn.Linear(3, 3)
        self.head = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm(self.base(x))
        return self.head(h + torch.tanh(self.adapter(h)))


class Adapter(LogisticRegression):
    """:class:`AdapterNet` as a classifier (with FedProx's and FedDyn's mixins); the submodules ``frozen`` names
    do not require grad. ``without_base``: the base and BatchNorm are identities, so that the module holds the
    shared tensors alone (under the same names)."""

    def __init__(self, *, frozen: Sequence[str] = ("base", "norm"), lr: float = 0.1, without_base: bool = False) -> None:
        super().__init__(in_features=3, num_classes=2, lr=lr)
        self.net = AdapterNet()
        if without_base:
            self.net.base, self.net.norm = nn.Identity(), nn.Identity()
            frozen = ()
        for name in frozen:
            self.net.get_submodule(name).requires_grad_(False)


class MaskedAdapter(MaskedNoiseMixin, Adapter):
    pass


class ProbabilityMaskedAdapter(ProbabilityMaskMixin, Adapter):
    pass


class MixtureAdapter(MixtureWeightedMixin, Adapter):
    pass


def adapter(cls: type[Adapter] = Adapter, **kwargs: Any) -> Adapter:
    torch.manual_seed(0)
    return cls(**kwargs)


VOCAB, WIDTH = 5, 3


class Tied(LinearTermMixin, ProximalMixin, ClassificationModule):
    """One token -> embedding -> tanh layer -> output layer whose weight *is* the embedding's (tied, as GPT-2's
    ``lm_head``); ``head`` has a bias of its own."""

    def __init__(self, *, lr: float = 0.5) -> None:
        super().__init__(num_classes=VOCAB, lr=lr)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mid = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.head.weight = self.embed.weight

    def hidden(self, x: Tensor) -> Tensor:
        return torch.tanh(self.mid(self.embed(x)))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.hidden(x))


#: The tied model's shared tensors: the tied weight once, under its first name.
TIED_SHARED = ("embed.weight", "mid.weight", "mid.bias", "head.bias")


class MaskedTied(MaskedNoiseMixin, Tied):
    """:class:`Tied` for FedMRN; in a round, records whether each forward's output layer computed with the
    embedding holder's effective (masked-noise) weight."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.checked: list[bool] = []

    def forward(self, x: Tensor) -> Tensor:
        h = self.hidden(x)
        out = self.head(h)
        effective = self.embed.latent_update.effective.get("weight")
        if effective is not None:
            alias = self.head.latent_update_alias.effective_weights(self.head)["weight"]
            self.checked.append(alias is effective and torch.equal(out, F.linear(h, effective, self.head.bias)))
        return out


def tied(cls: type[Tied] = Tied, **kwargs: Any) -> Tied:
    torch.manual_seed(0)
    return cls(**kwargs)


def token_data(num_clients: int = 3, seed: int = 0) -> FederatedDataModule:
    """60 single tokens; the label is the next token (``x + 1 mod VOCAB``)."""
    tokens = torch.randint(0, VOCAB, (60,), generator=torch.Generator().manual_seed(seed))
    dataset = InMemoryDataset(inputs=tokens, labels=(tokens + 1) % VOCAB, num_classes=VOCAB)
    return FederatedDataModule(dataset, num_clients=num_clients, batch_size=10)
