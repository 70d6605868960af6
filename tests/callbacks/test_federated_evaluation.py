"""FederatedEvaluation: exact per-client metrics, personalised models, groups, sampling, logging,
training left bit-identical, and clear errors."""

from __future__ import annotations

import csv
import random
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import Dataset

from fl_lightning import IFCA, FedALIGN, FedBuff, FederatedEvaluation, FederatedTrainer, FedSoft
from fl_lightning.data import Digits, Dirichlet, FederatedDataModule, InMemoryDataset
from fl_lightning.evaluation import evaluate_clients, summarize
from fl_lightning.models import CNN, MLP, LogisticRegression
from fl_lightning.participation import DelayGroups, UniformDelay

from ..integration.conftest import QUIET
from tests.recording_logger import RecordingLogger

NUM_CLIENTS = 8


def digits(*, holdout: float = 0.25, as_image: bool = False, num_clients: int = NUM_CLIENTS) -> FederatedDataModule:
    return FederatedDataModule(
        Digits(split="train", as_image=as_image),
        Digits(split="test", as_image=as_image),
        partitioner=Dirichlet(alpha=0.5),
        num_clients=num_clients,
        batch_size=16,
        holdout_fraction=holdout,
    )


def fit(
    callbacks: list[pl.Callback], *, model: pl.LightningModule | None = None, data: FederatedDataModule | None = None, **kwargs: Any
) -> tuple[pl.LightningModule, FederatedTrainer]:
    torch.manual_seed(0)
    model = model if model is not None else MLP(in_features=64, hidden=(16,), lr=0.1)
    options = {**QUIET, "max_epochs": 2, "clients_per_round": 4, "local_steps": 3, "limit_val_batches": 0, **kwargs}
    trainer = FederatedTrainer(callbacks=callbacks, **options)
    trainer.fit(model, datamodule=data if data is not None else digits())
    return model, trainer


def by_hand(module: torch.nn.Module, data: FederatedDataModule, cid: int, state: dict[str, torch.Tensor] | None = None) -> tuple[float, float]:
    """(loss, accuracy) of ``module`` (or of ``state`` loaded into a copy) on client ``cid``'s held-out samples, in plain PyTorch."""
    if state is not None:
        module = type(module)(**module.hparams)
        module.load_state_dict({**module.state_dict(), **state})
    subset = data.holdout_dataloader(cid).dataset
    x = torch.stack([data.train[i][0] for i in subset.indices])
    y = torch.tensor([int(data.train[i][1]) for i in subset.indices])
    with torch.no_grad():
        logits = module.net.eval()(x.to(next(module.parameters()).dtype))
    return F.cross_entropy(logits, y).item(), (logits.argmax(-1) == y).float().mean().item()


# --- the per-client numbers ---------------------------------------------------------------------------


def tiny_federation() -> tuple[LogisticRegression, FederatedDataModule]:
    """4 clients of 2-D points, 3 classes, a linear model with known weights; held-out batches of 5
    span client boundaries in the pooled pass."""
    g = torch.Generator().manual_seed(0)
    dataset = InMemoryDataset(inputs=torch.randn(40, 2, generator=g), labels=torch.randint(0, 3, (40,), generator=g), num_classes=3)
    data = FederatedDataModule(dataset, num_clients=4, batch_size=4, eval_batch_size=5, holdout_fraction=0.5)
    model = LogisticRegression(in_features=2, num_classes=3)
    with torch.no_grad():
        model.net[1].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]))
        model.net[1].bias.copy_(torch.tensor([0.0, 0.1, -0.2]))
    return model, data


def test_per_client_metrics_equal_a_hand_computation_on_a_tiny_federation():
    model, data = tiny_federation()
    results = evaluate_clients(model, data, [0, 1, 2, 3])
    x, y = data.train.tensors
    for r in results:
        idx = torch.as_tensor(data.holdout_dataloader(r.client_id).dataset.indices)
        logits = x[idx] @ torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]).T + torch.tensor([0.0, 0.1, -0.2])
        assert r.num_samples == len(idx) == 5
        assert r.accuracy == pytest.approx((logits.argmax(-1) == y[idx]).float().mean().item())
        assert r.loss == pytest.approx(F.cross_entropy(logits, y[idx]).item(), rel=1e-6)
    assert len({r.accuracy for r in results}) > 1  # the clients differ: a mix-up would show


class BatchListHoldout:
    """Held-out data as plain lists of batches (not a DataLoader): scored client by client."""

    def __init__(self, data: FederatedDataModule) -> None:
        self.data = data

    def holdout_dataloader(self, cid: int) -> list[Any]:
        return list(self.data.holdout_dataloader(cid))


class SampleBySample(Dataset):
    """A dataset without ``tensors``: the pooled pass reads it through ``ConcatDataset``, sample by sample."""

    def __init__(self, inner: InMemoryDataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        return self.inner[i]


def test_every_way_of_reading_held_out_data_gives_the_same_result():
    model, data = tiny_federation()
    expected = evaluate_clients(model, data, [3, 1, 0])  # pooled, cut from the dataset's tensors
    assert evaluate_clients(model, BatchListHoldout(data), [3, 1, 0]) == expected  # client by client
    plain = FederatedDataModule(SampleBySample(data.train), num_clients=4, batch_size=4, eval_batch_size=5, holdout_fraction=0.5)
    assert evaluate_clients(model, plain, [3, 1, 0]) == expected  # pooled, sample by sample


def test_the_callback_evaluates_the_final_global_model_on_every_client(tmp_path):
    callback = FederatedEvaluation()
    model, trainer = fit([callback])
    data = trainer.datamodule
    assert [r.client_id for r in callback.last_results] == list(range(NUM_CLIENTS))
    for r in callback.last_results:
        loss, acc = by_hand(model, data, r.client_id)
        assert (r.loss, r.accuracy) == (pytest.approx(loss, rel=1e-5), pytest.approx(acc))
        assert r.personal_loss is None
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("clients/")}
    assert logged == pytest.approx({f"clients/{k}": v for k, v in summarize(callback.last_results).items()})


# --- personalised models ------------------------------------------------------------------------------


def test_ifca_clients_are_evaluated_with_their_own_cluster_centre():
    callback = FederatedEvaluation()
    model, trainer = fit([callback], algorithm=IFCA(num_clusters=2))
    algorithm, data = trainer.algorithm, trainer.datamodule
    for r in callback.last_results:
        loss, acc = by_hand(model, data, r.client_id, dict(algorithm.personalized_state(r.client_id)))
        assert (r.personal_loss, r.personal_accuracy) == (pytest.approx(loss, rel=1e-5), pytest.approx(acc))
    assert any(r.personal_loss != pytest.approx(r.loss) for r in callback.last_results)  # not the global model
    assert float(trainer.callback_metrics["clients/personal/acc_mean"]) == pytest.approx(
        np.mean([r.personal_accuracy for r in callback.last_results])
    )


def test_fedsoft_clients_are_evaluated_with_their_personalised_weights_once_they_trained():
    callback = FederatedEvaluation()
    model, trainer = fit([callback], model=LogisticRegression(in_features=64, lr=0.1), algorithm=FedSoft(num_clusters=2, clients_per_cluster=2, tau=1))
    algorithm, data = trainer.algorithm, trainer.datamodule
    trained = set(algorithm.personal_models())
    assert 0 < len(trained) < NUM_CLIENTS
    for r in callback.last_results:
        if r.client_id not in trained:
            assert r.personal_loss is None and r.personal_accuracy is None
            continue
        loss, acc = by_hand(model, data, r.client_id, dict(algorithm.personalized_state(r.client_id)))
        assert (r.personal_loss, r.personal_accuracy) == (pytest.approx(loss, rel=1e-5), pytest.approx(acc))
        assert r.personal_loss != pytest.approx(r.loss)
    assert float(trainer.callback_metrics["clients/personal/count"]) == len(trained)


def test_personalized_false_evaluates_the_global_model_only():
    callback = FederatedEvaluation(personalized=False)
    fit([callback], algorithm=IFCA(num_clusters=2))
    assert all(r.personal_loss is None for r in callback.last_results)


# --- groups ---------------------------------------------------------------------------------------------


def group_metrics(trainer: pl.Trainer, group: str) -> dict[str, float]:
    prefix = f"clients/{group}/"
    return {k[len(prefix) :]: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(prefix)}


def test_fedalign_priority_and_nonpriority_groups_are_summarised():
    callback = FederatedEvaluation()
    _, trainer = fit([callback], algorithm=FedALIGN(priority=3, epsilon=0.5, warmup_fraction=0.0))
    assert callback.resolved_groups == {"priority": [0, 1, 2], "nonpriority": [3, 4, 5, 6, 7]}
    for name, members in callback.resolved_groups.items():
        expected = summarize([r for r in callback.last_results if r.client_id in members])
        assert group_metrics(trainer, name) == pytest.approx(expected)
    assert group_metrics(trainer, "priority")["count"] == 3


def test_explicit_groups_replace_those_the_algorithm_offers():
    callback = FederatedEvaluation(groups={"first": [1, 0, 1]})
    _, trainer = fit([callback], algorithm=FedALIGN(priority=3, epsilon=0.5, warmup_fraction=0.0))
    assert callback.resolved_groups == {"first": [0, 1]}
    assert group_metrics(trainer, "first")["count"] == 2 and not group_metrics(trainer, "priority")


class GroupedData(FederatedDataModule):
    """A data module that defines groups of its own."""

    def __init__(self, groups: dict[str, list[int]], **kwargs: Any) -> None:
        super().__init__(Digits(split="train"), partitioner=Dirichlet(alpha=0.5), num_clients=NUM_CLIENTS, batch_size=16, **kwargs)
        self.groups = groups

    def client_groups(self) -> dict[str, list[int]]:
        return self.groups


def test_the_data_modules_groups_join_the_algorithms_and_a_conflict_is_an_error():
    fedalign = {"algorithm": FedALIGN(priority=3, epsilon=0.5, warmup_fraction=0.0)}
    callback = FederatedEvaluation()
    fit([callback], data=GroupedData({"tail": [7], "priority": [0, 1, 2]}, holdout_fraction=0.25), **fedalign)
    assert callback.resolved_groups == {"priority": [0, 1, 2], "nonpriority": [3, 4, 5, 6, 7], "tail": [7]}
    with pytest.raises(ValueError, match="define client group 'priority' differently; pass `groups=`"):
        fit([FederatedEvaluation()], data=GroupedData({"priority": [0]}, holdout_fraction=0.25), **fedalign)


def test_fedbuff_named_delay_groups_are_evaluated_after_every_kth_aggregation():
    delays = DelayGroups([4, 4], [UniformDelay(1.0, 2.0), UniformDelay(8.0, 12.0)], names=["fast", "slow"])
    callback = FederatedEvaluation(every_n_rounds=2)
    _, trainer = fit([callback], algorithm=FedBuff(buffer_size=2, delays=delays), max_epochs=2, local_steps=1)
    assert callback.resolved_groups == {"fast": [0, 1, 2, 3], "slow": [4, 5, 6, 7]}
    assert group_metrics(trainer, "slow")["count"] == 4 and "acc_worst10" in group_metrics(trainer, "fast")


# --- sampling and interval ------------------------------------------------------------------------------


def test_sampling_is_seeded_by_round_and_the_trainer_seed_by_default():
    callback = FederatedEvaluation(sample_size=3)
    _, trainer = fit([callback], seed=5, max_epochs=3)
    twin = FederatedEvaluation(sample_size=3, seed=5)
    twin._algorithm, twin._root_seed = trainer.algorithm, 5  # as on_train_start would set them
    samples = [callback.clients_for(r) for r in range(6)]
    assert samples == [twin.clients_for(r) for r in range(6)]
    assert all(len(s) == 3 and s == sorted(set(s)) for s in samples) and len({tuple(s) for s in samples}) > 1
    assert [r.client_id for r in callback.last_results] == samples[2]  # the last round's sample
    assert float(trainer.callback_metrics["clients/count"]) == 3


def test_metrics_and_table_rows_come_every_kth_round_with_their_round(tmp_path):
    callback = FederatedEvaluation(every_n_rounds=2)
    logger = CSVLogger(tmp_path, name="run", version=0)
    fit([callback], logger=logger, max_epochs=5)
    rows = list(csv.DictReader(Path(logger.log_dir, "metrics.csv").read_text().splitlines()))
    assert [int(float(r["round"])) for r in rows if r.get("clients/acc_p10")] == [1, 3]
    # In the step order of the file: each evaluation row sits at its round's last optimizer step.
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps)
    assert Path(callback.table.path) == Path(logger.log_dir, "federated_evaluation.csv")
    table = list(csv.DictReader(Path(callback.table.path).read_text().splitlines()))
    assert list(table[0]) == ["round", "client", "group", "n", "loss", "acc"]
    assert [(int(r["round"]), int(r["client"])) for r in table] == [(k, c) for k in (1, 3) for c in range(NUM_CLIENTS)]
    assert [float(r["acc"]) for r in table[-NUM_CLIENTS:]] == pytest.approx([r.accuracy for r in callback.last_results])


def test_an_existing_table_file_is_never_overwritten(tmp_path):
    logger = CSVLogger(tmp_path, name="run", version=0)
    mine = Path(logger.log_dir, "federated_evaluation.csv")
    mine.parent.mkdir(parents=True)
    mine.write_text("my own file\n")
    callback = FederatedEvaluation()
    with pytest.warns(UserWarning, match="exists and is kept"):
        fit([callback], logger=logger, max_epochs=1)
    assert mine.read_text() == "my own file\n"
    assert Path(callback.table.path).name == "federated_evaluation-1.csv"


def test_loggers_that_take_tables_get_the_per_client_table_and_no_csv_is_written(tmp_path):
    logger = RecordingLogger()
    callback = FederatedEvaluation()
    fit([callback], logger=logger, algorithm=IFCA(num_clusters=2), default_root_dir=tmp_path)
    assert [t["key"] for t in logger.tables] == ["clients/table", "clients/table"]
    assert [row[0] for t in logger.tables for row in t["data"][:1]] == [0, 1]  # the round column
    assert 0 < logger.tables[0]["step"] < logger.tables[1]["step"]  # the rounds' last optimizer steps
    assert logger.tables[0]["columns"] == ["round", "client", "group", "n", "loss", "acc", "personal_loss", "personal_acc"]
    last = logger.tables[-1]["data"]
    assert [row[1] for row in last] == list(range(NUM_CLIENTS))
    assert [row[7] for row in last] == [r.personal_accuracy for r in callback.last_results]
    assert callback.table.path is None and not list(tmp_path.rglob("*.csv"))


# --- training is untouched ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    ["lightning", "lean", "batched", "batchnorm", "fedbuff", "ifca"],
)
def test_training_is_bit_identical_with_and_without_the_evaluation(case):
    def run(callbacks: list[pl.Callback]) -> tuple[dict[str, torch.Tensor], list[list[int]]]:
        torch.manual_seed(0)
        kwargs: dict[str, Any] = {"client_executor": case} if case in ("lean", "batched") else {}
        model = MLP(in_features=64, hidden=(16,), lr=0.1)
        data = None
        if case == "batchnorm":
            model, data = CNN(in_channels=1, image_size=8, num_classes=10, batch_norm=True, lr=0.05), digits(as_image=True)
        if case == "fedbuff":
            kwargs.update(algorithm=FedBuff(buffer_size=2), local_steps=1, max_epochs=3)
        if case == "ifca":
            kwargs.update(algorithm=IFCA(num_clusters=2))
        model, trainer = fit(callbacks, model=model, data=data, **kwargs)
        return {k: v.clone() for k, v in model.state_dict().items()}, trainer.fit_loop.history

    plain, evaluated = run([]), run([FederatedEvaluation()])
    assert evaluated[1] == plain[1]
    assert plain[0].keys() == evaluated[0].keys()
    for name, tensor in plain[0].items():
        assert torch.equal(evaluated[0][name], tensor), name


def test_an_evaluation_leaves_rng_states_training_mode_and_batchnorm_statistics_alone():
    callback = FederatedEvaluation()
    model, trainer = fit([callback], model=CNN(in_channels=1, image_size=8, num_classes=10, batch_norm=True), data=digits(as_image=True), max_epochs=1)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())
    callback.on_round_aggregated(trainer, model, 1, {})
    assert len(callback.last_results) == NUM_CLIENTS
    assert torch.equal(torch.get_rng_state(), rng[0]) and np.array_equal(np.random.get_state()[1], rng[1]) and random.getstate() == rng[2]
    assert model.training and all(m.training for m in model.modules())
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


# --- configuration and errors ---------------------------------------------------------------------------


def test_selectable_from_yaml_through_the_cli(tmp_path, monkeypatch):
    from fl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fl-lightning"])
    config = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    overlay = tmp_path / "evaluation.yaml"
    overlay.write_text(
        "trainer:\n  callbacks:\n    - class_path: fl_lightning.FederatedEvaluation\n      init_args: {every_n_rounds: 1, sample_size: 5}\n"
        "data:\n  init_args: {holdout_fraction: 0.2}\n"
    )
    main(["fit", "--config", str(config), "--config", str(overlay), "--trainer.max_epochs", "1", "--trainer.local_epochs", "1",
          "--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "false"])
    run_dir = tmp_path / "logs" / "quickstart" / "version_0"
    rows = list(csv.DictReader((run_dir / "metrics.csv").read_text().splitlines()))
    assert [float(r["clients/count"]) for r in rows if r.get("clients/count")] == [5.0]
    assert len((run_dir / "federated_evaluation.csv").read_text().splitlines()) == 1 + 5


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"every_n_rounds": 0}, ValueError, r"`every_n_rounds` must be an int >= 1 .* got 0"),
        ({"every_n_rounds": 1.5}, ValueError, "got 1.5"),
        ({"sample_size": 0}, ValueError, r"`sample_size` must be None \(every client\) or an int >= 1, got 0"),
        ({"seed": -1}, ValueError, "`seed` must be None"),
        ({"groups": {"personal": [0]}}, ValueError, "other than 'personal'"),
        ({"groups": {"a/b": [0]}}, ValueError, "without '/'"),
        ({"groups": {"a": ["0"]}}, TypeError, "int client ids"),
        ({"groups": [0, 1]}, TypeError, "must map group names"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        FederatedEvaluation(**kwargs)


def test_clients_for_before_the_fit_says_why():
    with pytest.raises(RuntimeError, match="once the fit has started"):
        FederatedEvaluation(sample_size=2).clients_for(0)


def test_delay_groups_are_named_group_g_by_default_and_need_one_distinct_name_each():
    models = [UniformDelay(1.0, 2.0), UniformDelay(8.0, 12.0)]
    assert DelayGroups([2, 3], models).client_groups() == {"group0": [0, 1], "group1": [2, 3, 4]}
    for names in (["fast"], ["fast", "fast"]):
        with pytest.raises(ValueError, match="one distinct name per group"):
            DelayGroups([2, 3], models, names=names)


def test_a_sample_larger_than_the_federation_is_refused_when_the_fit_starts():
    with pytest.raises(ValueError, match=r"`sample_size=9` is outside 1..8"):
        fit([FederatedEvaluation(sample_size=9)])


def test_group_ids_outside_the_federation_are_refused():
    with pytest.raises(ValueError, match=r"group 'far' has client ids \[8\] outside 0..7"):
        fit([FederatedEvaluation(groups={"far": [0, 8]})])


def test_no_held_out_data_names_the_fix():
    with pytest.raises(ValueError, match=r"holdout_fraction=0: set `holdout_fraction`"):
        fit([FederatedEvaluation()], data=digits(holdout=0.0))


def test_a_plain_trainer_is_refused():
    trainer = pl.Trainer(**QUIET, max_epochs=1, limit_train_batches=1, limit_val_batches=0, callbacks=[FederatedEvaluation()])
    with pytest.raises(TypeError, match="use it with FederatedTrainer"):
        trainer.fit(MLP(in_features=64, hidden=(16,)), datamodule=digits())


def test_a_double_precision_fit_scores_its_clients_in_float64():
    # The held-out batches are float32; under precision="64-true" they once reached the float64 model
    # unconverted and the evaluation failed with a dtype error.
    evaluation = FederatedEvaluation()
    model, trainer = fit([evaluation], precision="64-true")
    data = trainer.datamodule
    expected = by_hand(model, data, 0)
    row = next(r for r in evaluation.last_results if r.client_id == 0)
    assert row.loss == pytest.approx(expected[0], rel=1e-6) and row.accuracy == pytest.approx(expected[1])
