"""The batched client executor gives the sequential executors' per-client updates and global weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from fl_lightning import FedAvg, FedProx
from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.algorithms.shared.server_optimizers import ServerSGD
from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.data import Dirichlet, FederatedDataModule, InMemoryDataset
from fl_lightning.loops.batched_executor import flatten_stream, group_clients, pad_batches
from fl_lightning.loops.batched_sgd import StackedState, batched_step
from fl_lightning.models import CNN, MLP

from ..integration.conftest import quiet_trainer

TOL = 1e-5


def synthetic_data(
    *, image: bool = False, num_clients: int = 6, batch_size: int = 8, drop_last: bool = False, holdout_fraction: float = 0.0
) -> FederatedDataModule:
    """Label-skewed clients of unequal sizes: different step counts and last-batch sizes (``holdout_fraction`` of each
    client's samples held out)."""
    g = torch.Generator().manual_seed(0)
    shape = (1, 8, 8) if image else (12,)
    dataset = InMemoryDataset(
        inputs=torch.randn(180, *shape, generator=g), labels=torch.randint(0, 4, (180,), generator=g), num_classes=4
    )
    return FederatedDataModule(
        dataset,
        partitioner=Dirichlet(alpha=0.5),
        num_clients=num_clients,
        batch_size=batch_size,
        drop_last=drop_last,
        holdout_fraction=holdout_fraction,
        seed=0,
    )


class ClientLog(FederatedCallback):
    """Records the hook calls and every update, by ``(round, client)``."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []
        self.updates: dict[tuple[int, int], ClientUpdate] = {}

    def on_client_start(self, trainer: Any, pl_module: Any, client: ClientContext) -> None:
        self.events.append(("start", client.round_idx, client.client_id))

    def on_client_end(self, trainer: Any, pl_module: Any, client: ClientContext, update: ClientUpdate) -> None:
        self.events.append(("end", client.round_idx, client.client_id))
        self.updates[client.round_idx, client.client_id] = update


class OrderRecordingFedAvg(FedAvg):
    """FedAvg that records the order of the updates it aggregates (``configure_client`` untouched)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.received: list[list[int]] = []

    def aggregate(self, round_idx: int, global_state: Any, updates: list[ClientUpdate]) -> dict[str, float]:
        self.received.append([u.client_id for u in updates])
        return super().aggregate(round_idx, global_state, updates)


def fit(
    executor: str, model_fn: Callable[[], Any], *, image: bool = False, data: dict[str, Any] | None = None, **kwargs: Any
) -> tuple[Any, ClientLog, Any]:
    torch.manual_seed(0)
    model, log = model_fn(), ClientLog()
    algorithm = kwargs.pop("algorithm", OrderRecordingFedAvg)()  # a factory: algorithms hold state
    kwargs = {"max_epochs": 2, "clients_per_round": 4, **kwargs}
    callbacks = [log, *kwargs.pop("callbacks", ())]
    trainer = quiet_trainer(client_executor=executor, callbacks=callbacks, algorithm=algorithm, **kwargs)
    trainer.fit(model, datamodule=synthetic_data(image=image, **(data or {})))
    return model, log, trainer.algorithm


def max_diff(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


SCENARIOS = {
    "unequal-epochs": (lambda: MLP(in_features=12, hidden=(16,), num_classes=4, lr=0.1), False, {"local_epochs": 2}),
    "steps-momentum-wd": (
        lambda: MLP(in_features=12, hidden=(16, 8), num_classes=4, lr=0.05, momentum=0.9, weight_decay=1e-3),
        False,
        {"local_steps": 5, "algorithm": lambda: OrderRecordingFedAvg(server_optimizer=ServerSGD(lr=1.0, momentum=0.5))},
    ),
    "cnn": (lambda: CNN(in_channels=1, image_size=8, num_classes=4, lr=0.05), True, {}),
    # BatchNorm on batches of one shape (torch's batch_norm under vmap): full batches, equal steps. On padded batches,
    # normalised over each client's real samples: test_batched_methods.py.
    "cnn-batchnorm-equal-batches": (
        lambda: CNN(in_channels=1, image_size=8, num_classes=4, batch_norm=True, lr=0.05),
        True,
        {"local_steps": 3, "data": {"batch_size": 4, "drop_last": True}},
    ),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("reference", ["lightning", "lean"])
def test_batched_equals_sequential(scenario: str, reference: str) -> None:
    model_fn, image, kwargs = SCENARIOS[scenario]
    kwargs = dict(kwargs)
    ref_model, ref_log, ref_algorithm = fit(reference, model_fn, image=image, **kwargs)
    model, log, algorithm = fit("batched", model_fn, image=image, **kwargs)

    # Hooks: each client started once, then ended once; updates aggregated in the clients' order.
    assert sorted(log.events) == sorted(ref_log.events)
    assert all(log.events.index(("start", r, c)) < log.events.index(("end", r, c)) for _, r, c in log.events)
    assert algorithm.received == ref_algorithm.received == [sorted(ids) for ids in ref_algorithm.received]
    assert log.updates.keys() == ref_log.updates.keys() and len(log.updates) == 8
    for key, want in ref_log.updates.items():
        got = log.updates[key]
        assert (got.num_samples, got.num_steps, got.upload_bytes) == (want.num_samples, want.num_steps, want.upload_bytes)
        assert max_diff(got.payload, want.payload) <= TOL, key
        assert got.metrics["train_loss"] == pytest.approx(want.metrics["train_loss"], abs=TOL), key
    assert max_diff(model.state_dict(), ref_model.state_dict()) <= TOL
    if scenario in ("unequal-epochs", "cnn"):  # ragged clients: unequal step counts in one vmap group
        assert len({u.num_steps for u in log.updates.values()}) > 1


def relative_diff(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """The largest ``|a - b| / |b|`` (Frobenius norms) over the tensors."""
    return max(float((a[k].double() - b[k].double()).norm() / b[k].double().norm()) for k in b)


@pytest.mark.parametrize("reference", ["lightning", "lean"])
def test_ragged_clients_equal_sequential_after_five_rounds(reference: str) -> None:
    """Dirichlet clients of 4..60 samples, two local epochs (a partial batch mid-stream and at the end),
    momentum and weight decay: padded samples and finished clients must leave no trace."""
    def model_fn() -> MLP:
        return MLP(in_features=12, hidden=(16,), num_classes=4, lr=0.05, momentum=0.9, weight_decay=1e-2)

    kwargs: dict[str, Any] = {"max_epochs": 5, "clients_per_round": 6, "local_epochs": 2}
    ref_model, ref_log, _ = fit(reference, model_fn, **kwargs)
    model, log, _ = fit("batched", model_fn, **kwargs)
    steps = {key: u.num_steps for key, u in log.updates.items()}
    assert steps == {key: u.num_steps for key, u in ref_log.updates.items()} and len(set(steps.values())) > 2
    assert relative_diff(model.state_dict(), ref_model.state_dict()) <= 1e-6


def test_max_batched_clients_caps_a_group_without_changing_the_result() -> None:
    def run(**kwargs: Any) -> tuple[Any, ClientLog]:
        torch.manual_seed(0)
        model, log = MLP(in_features=12, hidden=(16,), num_classes=4, lr=0.1, momentum=0.9), ClientLog()
        trainer = quiet_trainer(max_epochs=1, clients_per_round=4, local_steps=3, client_executor="batched", callbacks=[log], **kwargs)
        trainer.fit(model, datamodule=synthetic_data(batch_size=1))  # batches of 1: every client has the same shapes
        return model, log

    capped_model, capped_log = run(max_batched_clients=3)
    model, log = run()
    assert max_diff(capped_model.state_dict(), model.state_dict()) <= TOL
    # By default the fit's first client trains alone (measuring its activations), then the other 3 as one group.
    assert [kind for kind, _, _ in log.events] == ["start", "end"] + ["start"] * 3 + ["end"] * 3
    assert [kind for kind, _, _ in capped_log.events] == ["start"] * 3 + ["end"] * 3 + ["start", "end"]  # 3 + 1


@pytest.mark.parametrize(("executor", "cap"), [("batched", 0), ("batched", 1.5), ("lean", 2)])
def test_bad_max_batched_clients(executor: str, cap: Any) -> None:
    with pytest.raises(ValueError, match=f"`max_batched_clients` must be a positive integer.*got {cap!r}"):
        quiet_trainer(client_executor=executor, max_batched_clients=cap)


class TiedMLP(MLP):
    """Two hidden layers sharing one weight matrix (one tensor under two ``state_dict`` names)."""

    def __init__(self) -> None:
        super().__init__(in_features=12, hidden=(12, 12), num_classes=4, lr=0.1)
        self.net[3].weight = self.net[1].weight


def test_tied_weights_stay_tied() -> None:
    ref_model, _, _ = fit("lean", TiedMLP)
    model, _, _ = fit("batched", TiedMLP)
    assert model.net[3].weight is model.net[1].weight
    assert max_diff(model.state_dict(), ref_model.state_dict()) <= TOL


def test_groups_by_steps_and_pads_with_a_mask() -> None:
    assert group_clients([3, 5, 0, 5, 2]) == [[1, 3, 0, 4, 2]]  # most steps first, ties in order
    assert group_clients([3, 5, 0, 5, 2], max_clients=2) == [[1, 3], [0, 4], [2]]
    first, second = torch.arange(6.0).reshape(3, 2), torch.arange(10.0, 12.0).reshape(1, 2)
    stacked, mask = pad_batches([[first, torch.tensor([0, 1, 2])], [second, torch.tensor([5])]])
    assert torch.equal(stacked[0][1], torch.tensor([[10.0, 11.0]] * 3))  # copies of the first sample
    assert torch.equal(stacked[1], torch.tensor([[0, 1, 2], [5, 5, 5]]))
    assert torch.equal(mask, torch.tensor([[True, True, True], [True, False, False]]))
    # Compiled steps: one shape for a group, a finished client's row all padding.
    stacked, mask = pad_batches([[first, torch.tensor([0, 1, 2])]], size=4, clients=2)
    assert [tuple(t.shape) for t in stacked] == [(2, 4, 2), (2, 4)]
    assert torch.equal(mask, torch.tensor([[True, True, True, False], [False] * 4]))
    with pytest.raises(ValueError, match=r"one row per sample; got a batch of tensors with shapes \[\(3, 2\), \(2,\)\]"):
        pad_batches([[first, torch.tensor([0, 1])], [second, torch.tensor([5])]])
    with pytest.raises(TypeError, match="batches made of tensors only"):
        flatten_stream([(torch.zeros(4, 3), "labels")])


class SumsLosses(MLP):
    """A summed (not averaged) loss: padding would count the padded copies' gradients."""

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return super().training_step(batch, batch_idx) * len(batch[1])


class LogsPerStep(MLP):
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss, on_step=True)
        return loss


def test_a_training_step_that_logs_trains_as_sequentially_and_its_logging_is_skipped_with_one_warning() -> None:
    def model_fn() -> LogsPerStep:
        return LogsPerStep(in_features=12, hidden=(8,), num_classes=4, lr=0.1)

    ref_model, _, _ = fit("lean", model_fn, local_epochs=2)
    with pytest.warns(UserWarning, match=r"skips the self.log calls of LogsPerStep.training_step \(train_loss\)") as caught:
        model, log, _ = fit("batched", model_fn, local_epochs=2)
    assert sum("skips the self.log" in str(w.message) for w in caught) == 1
    assert max_diff(model.state_dict(), ref_model.state_dict()) <= TOL
    assert all("train_loss" in u.metrics for u in log.updates.values())
    assert "log" not in vars(model)  # Lightning's methods are back


class ConfiguresClients(FedProx):
    """Overrides ``configure_client`` without declaring ``configure_client_sets_terms`` (FedProx's declaration is
    FedProx's own): the batched executor cannot know what it does."""

    def configure_client(self, client: ClientContext, module: Any, global_state: Any) -> None:
        super().configure_client(client, module, global_state)


class RMSpropMLP(MLP):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.RMSprop(self.parameters(), lr=0.01)


def rmsprop_mlp() -> MLP:
    return RMSpropMLP(in_features=12, hidden=(8,), num_classes=4)


def batch_norm_without_running_statistics() -> MLP:
    """Normalises with its batch's statistics in evaluation mode too, where padded steps check the loss per sample."""
    model = MLP(in_features=12, hidden=(8,), num_classes=4)
    model.net.insert(2, nn.BatchNorm1d(8, track_running_stats=False))
    return model


@pytest.mark.parametrize(
    ("model_fn", "kwargs", "error", "match"),
    [
        (
            lambda: MLP(in_features=12, hidden=(8,), num_classes=4),
            {"algorithm": ConfiguresClients},
            ValueError,
            r"ConfiguresClients.configure_client \(of ConfiguresClients\) does not declare it, so what it does is unknown",
        ),
        (rmsprop_mlp, {}, ValueError, r"steps torch.optim.SGD, Adam and AdamW only; got torch.optim.rmsprop.RMSprop.*'lightning'"),
        (lambda: MLP(in_features=12, hidden=(8,), num_classes=4), {"reset_optimizer": False}, ValueError, "reset_optimizer=True"),
        (lambda: MLP(in_features=12, hidden=(8,), num_classes=4), {"gradient_clip_val": 1.0}, ValueError, "gradient_clip_val"),
        (
            batch_norm_without_running_statistics,
            {},
            ValueError,
            r"MLP has BatchNorm layers without running statistics \(net.2\)",
        ),
        (
            lambda: SumsLosses(in_features=12, hidden=(8,), num_classes=4),
            {},
            ValueError,
            r"SumsLosses.training_step gave .* on a batch of 8 samples, but .* as the mean of its losses on each sample alone",
        ),
    ],
    ids=["configure-client", "rmsprop", "no-reset", "clipping", "batchnorm-without-running-statistics-ragged", "summed-loss"],
)
def test_unsupported_runs_fail_clearly(model_fn: Callable[[], Any], kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        fit("batched", model_fn, **kwargs)


def test_a_stacked_weight_takes_its_gradients_memory_layout() -> None:
    """A vmapped linear layer's gradient comes out transposed in memory; the stacked weight follows it
    (so the SGD update reads both in order), keeping its values, and tied names still share it."""
    model = TiedMLP()
    state = StackedState(dict(model.state_dict(keep_vars=True)), torch.optim.SGD(model.parameters(), lr=0.1), 3, {})
    step = batched_step(model, state.tied, tuple, padded=False)
    grads, _ = step(state.trained, state.others, ({}, {}), [torch.randn(3, 5, 12), torch.randint(0, 4, (3, 5))], 0)
    transposed = [name for name, g in grads.items() if not g.is_contiguous()]
    assert transposed  # else this test would show nothing
    before = {name: t.clone() for name, t in state.by_name.items()}
    state.match_layout(grads)
    for name in transposed:
        assert state.trained[name].stride() == grads[name].stride()
    assert all(torch.equal(state.by_name[name], t) for name, t in before.items())
    assert state.by_name["net.3.weight"] is state.by_name["net.1.weight"] is state.trained["net.1.weight"]
    assert all(state.groups[0][1][name] is state.trained[name] for name in state.trained)
