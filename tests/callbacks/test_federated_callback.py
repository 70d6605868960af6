"""FederatedCallback: the loop's events reach every federated callback, in order, with what they promise."""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from fl_lightning import FedAvg, FedBuff, FederatedCallback
from fl_lightning.participation.speed import ConstantDelay

from ..algorithms.quadratic import Quadratic, quadratic_data, quadratic_trainer


class Events(FederatedCallback):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_clients_selected(self, trainer, pl_module, round_idx, client_ids):
        self.events.append(("selected", round_idx, list(client_ids)))

    def on_client_start(self, trainer, pl_module, client):
        self.events.append(("start", client.round_idx, client.client_id))

    def on_client_end(self, trainer, pl_module, client, update):
        assert update.client_id == client.client_id and update.num_steps == client.completed_steps == 2
        self.events.append(("end", client.round_idx, client.client_id))

    def on_round_aggregated(self, trainer, pl_module, round_idx, metrics):
        self.events.append(("aggregated", round_idx, metrics["round/aggregated_clients"]))


def test_synchronous_rounds_in_order():
    events, plain = Events(), Callback()
    trainer = quadratic_trainer(max_epochs=2, algorithm=FedAvg(), clients_per_round=2, local_steps=2, callbacks=[plain, events])
    trainer.fit(Quadratic(), datamodule=quadratic_data())
    clients = trainer.fit_loop.history
    expected = []
    for r, (a, b) in enumerate(clients):
        expected += [("selected", r, [a, b]), ("start", r, a), ("end", r, a), ("start", r, b), ("end", r, b), ("aggregated", r, 2.0)]
    assert events.events == expected


def test_asynchronous_aggregations_hear_dispatches_and_buffers():
    events = Events()
    algorithm = FedBuff(buffer_size=2, delays=ConstantDelay([1.0, 1.0, 3.0, 3.0]))
    quadratic_trainer(max_epochs=2, algorithm=algorithm, local_steps=2, callbacks=[events]).fit(Quadratic(), datamodule=quadratic_data())
    kinds = [e[0] for e in events.events]
    assert "selected" not in kinds  # nothing is selected: clients are dispatched
    assert [e for e in events.events if e[0] == "aggregated"] == [("aggregated", 0, 2.0), ("aggregated", 1, 2.0)]
    assert kinds.count("start") == kinds.count("end") and kinds[:8] == ["start", "end"] * 4  # the initial dispatch of all four


def test_a_hook_set_on_the_instance_is_called_and_the_base_class_ones_are_skipped():
    """call_federated_hook skips the base class's no-op hooks (some run once per client), never a hook set on an
    instance or a subclass's override."""
    seen: list[str] = []
    on_instance = FederatedCallback()
    on_instance.on_client_start = lambda trainer, pl_module, client: seen.append(f"start {client.client_id}")
    bare = FederatedCallback()
    trainer = quadratic_trainer(max_epochs=1, algorithm=FedAvg(), clients_per_round=2, local_steps=1, callbacks=[bare, on_instance])
    trainer.fit(Quadratic(), datamodule=quadratic_data())
    assert seen == [f"start {cid}" for cid in trainer.fit_loop.history[0]]
