"""A minimal stateful, summable algorithm for the client store's tests: clients upload their running mean delta."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from fl_lightning import FedAvg
from fl_lightning.algorithms import ClientContext, ClientUpdate
from fl_lightning.server.client_store import ClientStore
from fl_lightning.server.model_state import State


class RunningMeanFedAvg(FedAvg):
    """FedAvg whose client uploads the mean of every delta it has computed so far: each client's sum of deltas and
    count live in :attr:`sums`, written and read on the rank that trains it, so the store decides the next update."""

    def __init__(self) -> None:
        super().__init__()
        self.sums = ClientStore()

    def client_update(self, client: ClientContext, module: pl.LightningModule, delta: State) -> ClientUpdate:
        previous = self.sums.get(client.client_id)
        count = 1 if previous is None else int(previous["count"]) + 1
        total = {k: v.detach().cpu() + (0 if previous is None else previous[k]) for k, v in delta.items()}
        self.sums.put(client.client_id, {**total, "count": torch.tensor(count)})
        mean = {k: (total[k] / count).to(v.device, v.dtype) for k, v in delta.items()}
        return super().client_update(client, module, mean)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "sums": self.sums.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.check_client_ids(state["sums"]["entries"], "sums")
        self.sums.load_state_dict(state["sums"])
