"""Every Lightning ``Trainer`` argument under federation, through the Python API: the table in
``docs/lightning_integration.md`` covers ``Trainer.__init__``'s signature, each refusal is one
``ValueError`` naming the argument, each per-round meaning is what a run does, and a fit that ends
for any reason leaves the module holding the global model of the last completed round."""

from __future__ import annotations

import inspect
import re
import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, Timer

from fl_lightning import FedBuff, FederatedTrainer
from fl_lightning.data import FederatedDataModule, InMemoryDataset
from fl_lightning.models import LogisticRegression
from fl_lightning.participation import UniformDelay
from fl_lightning.trainer_arguments import MEANINGS

from .quiet import QUIET

DOCS = Path(__file__).resolve().parents[1] / "docs" / "lightning_integration.md"
NUM_CLIENTS, BATCHES_PER_CLIENT = 4, 2  # 40 training samples, IID, batches of 5: 8 steps a round
ROUND_STEPS = NUM_CLIENTS * BATCHES_PER_CLIENT


def _data() -> FederatedDataModule:
    g = torch.Generator().manual_seed(0)
    train = InMemoryDataset(inputs=torch.randn(40, 3, generator=g), labels=torch.randint(0, 2, (40,), generator=g), num_classes=2)
    val = InMemoryDataset(inputs=torch.randn(12, 3, generator=g), labels=torch.randint(0, 2, (12,), generator=g), num_classes=2)
    return FederatedDataModule(train, val=val, num_clients=NUM_CLIENTS, batch_size=5, eval_batch_size=4)


class _Counting(LogisticRegression):
    """Counts training steps and validation batches; optionally raises in round ``fail_round``."""

    def __init__(self, fail_round: int | None = None, error: type[BaseException] = RuntimeError) -> None:
        super().__init__(in_features=3, num_classes=2, lr=0.1)
        self.steps = self.val_batches = 0
        self.fail_round, self.error = fail_round, error

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps += 1
        if self.trainer.current_epoch == self.fail_round and self.steps > self.fail_round * ROUND_STEPS + 3:
            raise self.error("client failure")  # in the round's second client
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.val_batches += 1
        return super().validation_step(batch, batch_idx)


def _fit(**kwargs: Any) -> tuple[_Counting, FederatedTrainer]:
    torch.manual_seed(0)
    model = _Counting()
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": 3, **kwargs})
    trainer.fit(model, datamodule=_data())
    return model, trainer  # type: ignore[return-value]


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _global_after(rounds: int) -> dict[str, torch.Tensor]:
    """The reference: the global model of a run that completes ``rounds`` rounds and stops there."""
    model, _ = _fit(max_epochs=rounds)
    return _weights(model)


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _docs_table() -> dict[str, str]:
    """``argument -> meaning`` from the table under "Trainer arguments under federation"."""
    section = DOCS.read_text().split("## Trainer arguments under federation", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| `")]
    return {name: meaning.strip() for names, meaning in rows for name in re.findall(r"`(\w+)`", names)}


def test_the_table_covers_every_trainer_argument_in_code_and_docs() -> None:
    signature = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
    assert set(MEANINGS) == signature
    assert _docs_table() == MEANINGS


REFUSALS = [
    ({"max_epochs": -5}, r"`max_epochs` \(rounds\) must be an integer >= 0 or -1 \(no limit\), got -5\."),
    ({"max_steps": -3}, r"`max_steps` .* must be an integer >= 0 or -1 \(no limit\), got -3\."),
    ({"min_epochs": -1}, r"`min_epochs` .* must be an integer >= 0, got -1\."),
    ({"min_steps": 1.5}, r"`min_steps` .* must be an integer >= 0, got 1\.5\."),
    ({"check_val_every_n_epoch": 0}, r"`check_val_every_n_epoch` .* must be an integer >= 1, got 0\."),
    ({"check_val_every_n_epoch": None}, r"`check_val_every_n_epoch` .* must be an integer >= 1, got None\."),
    ({"devices": 0}, r"`devices` must be 'auto', a positive number of devices, -1 .* got 0\."),
    ({"devices": "0"}, r"`devices` must be .* got 0\."),
    ({"accelerator": "abacus"}, r"`accelerator='abacus'` is not an accelerator Lightning knows: use one of \['auto', 'cpu'"),
    ({"val_check_interval": 0.5}, r"`val_check_interval=0\.5` would validate inside a round.*check_val_every_n_epoch"),
    ({"val_check_interval": 1}, r"`val_check_interval=1` would validate inside a round"),
    ({"val_check_interval": "00:00:01:00"}, r"`val_check_interval='00:00:01:00'` would validate inside a round"),
    ({"limit_train_batches": 0}, r"`limit_train_batches=0` trains no client"),
    ({"reload_dataloaders_every_n_epochs": 1}, r"`reload_dataloaders_every_n_epochs=1` cannot be honoured"),
    ({"sync_batchnorm": True}, r"`sync_batchnorm=True` would synchronise BatchNorm statistics"),
    ({"barebones": True}, r"`barebones=True` disables the logging and callbacks"),
    ({"use_distributed_sampler": True}, r"`use_distributed_sampler` must be False under FederatedTrainer"),
    # Refused by Lightning (MisconfigurationException): the same one ValueError.
    ({"limit_val_batches": -1}, r"invalid value -1 for limit_val_batches"),
]


@pytest.mark.parametrize(("kwargs", "match"), REFUSALS, ids=[f"{n}={v!r}" for k, _ in REFUSALS for n, v in k.items()])
def test_a_refused_argument_is_one_value_error_at_construction(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FederatedTrainer(**{**QUIET, **kwargs})


@pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(), reason="needs a machine without a GPU")
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clients_per_rond": 4}, r"unknown argument `clients_per_rond` \(did you mean `clients_per_round`\?\): it takes"),
        ({"max_epoch": 3}, r"unknown argument `max_epoch` \(did you mean `max_epochs`\?\)"),
        ({"zzzz": 1}, r"unknown argument `zzzz`: it takes the federation arguments \(algorithm, clients_per_round, .*\) and"),
    ],
)
def test_an_unknown_argument_names_it_and_the_closest_accepted_one(kwargs: dict[str, Any], match: str) -> None:
    """A new-user finding: a misspelt argument was Python's "Trainer.__init__() got an unexpected keyword argument",
    naming Lightning's class and nothing that is accepted."""
    with pytest.raises(TypeError, match=rf"^FederatedTrainer got an {match}"):
        FederatedTrainer(**kwargs)


def test_an_accelerator_this_machine_lacks_is_refused_naming_those_it_has() -> None:
    with pytest.raises(ValueError, match=r"`accelerator='gpu'` is not available on this machine: use one of \['auto', 'cpu'\]"):
        FederatedTrainer(**{**QUIET, "accelerator": "gpu"})


class _StopAfterFirstStep(Callback):
    """Sets ``should_stop`` inside the first client, as a step-interval ``Timer`` or a user's callback may."""

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        trainer.should_stop = True


STOPS = {
    "max_steps": ({"max_steps": 3}, "max_steps=3 reached in round 0 (global step 8); stopped at its end"),
    "max_time": ({"max_time": {"microseconds": 1}, "max_epochs": -1}, "time limit (max_time or a Timer) reached in round 0"),
    "step-timer": ({"callbacks": [Timer(duration={"microseconds": 1}, interval="step")]}, "time limit (max_time or a Timer)"),
    "should_stop": ({"callbacks": [_StopAfterFirstStep()]}, "should_stop set (by a callback or the algorithm) in round 0"),
    "early-stopping": (
        {"callbacks": [EarlyStopping(monitor="val_loss", stopping_threshold=1e9)]},
        "EarlyStopping on 'val_loss' after round 0 (stopping_threshold)",
    ),
}


@pytest.mark.parametrize("executor", ["lightning", "lean"])
@pytest.mark.parametrize("stop", list(STOPS))
def test_a_limit_stops_the_fit_at_the_end_of_the_round_with_the_global_model(stop: str, executor: str) -> None:
    kwargs, reason = STOPS[stop]
    if executor == "lean" and stop in ("step-timer", "should_stop"):
        pytest.skip("per-batch callbacks run under the Lightning executor only")
    model, trainer = _fit(client_executor=executor, **kwargs)
    assert (trainer.current_epoch, model.steps) == (1, ROUND_STEPS)  # every client of round 0 trained in full
    assert reason in trainer.fit_loop.stop_reason
    _assert_same(_weights(model), _global_after(1))


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_a_fit_that_fails_inside_a_client_leaves_the_global_model_of_the_last_completed_round(
    error: type[BaseException],
) -> None:
    handler = signal.getsignal(signal.SIGINT)
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": 3, "client_executor": "lightning"})
    torch.manual_seed(0)
    model = _Counting(fail_round=1, error=error)
    try:  # Lightning ends a KeyboardInterrupt with sys.exit(1), after ignoring further SIGINTs
        with pytest.raises(SystemExit if error is KeyboardInterrupt else RuntimeError):
            trainer.fit(model, datamodule=_data())
    finally:
        signal.signal(signal.SIGINT, handler)
    reason = trainer.fit_loop.stop_reason
    assert reason.endswith("in round 1; the module holds the global model of round 0")
    assert reason.startswith("interrupted (KeyboardInterrupt)" if error is KeyboardInterrupt else "RuntimeError: client failure")
    _assert_same(_weights(model), _global_after(1))


class _FailingValidation(_Counting):
    """Raises in the validation of round ``validation_round`` (after its aggregation)."""

    def __init__(self, validation_round: int) -> None:
        super().__init__()
        self.validation_round = validation_round

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        if not self.trainer.sanity_checking and self.trainer.current_epoch == self.validation_round:
            raise RuntimeError("validation failure")
        return super().validation_step(batch, batch_idx)


def test_a_failure_in_a_rounds_validation_names_that_round_as_the_one_the_module_holds() -> None:
    trainer = FederatedTrainer(**{**QUIET, "max_epochs": 3})
    torch.manual_seed(0)
    model = _FailingValidation(validation_round=1)
    with pytest.raises(RuntimeError, match="validation failure"):
        trainer.fit(model, datamodule=_data())
    assert trainer.fit_loop.stop_reason == (
        "RuntimeError: validation failure in round 1, after its aggregation; the module holds the global model of round 1"
    )
    _assert_same(_weights(model), _global_after(2))


def test_an_asynchronous_fit_stops_at_the_end_of_an_aggregation_with_the_global_model() -> None:
    def buffered() -> FedBuff:
        return FedBuff(buffer_size=2, concurrency=3, delays=UniformDelay(1.0, 3.0))

    reference, _ = _fit(algorithm=buffered(), max_epochs=1)
    stopped, trainer = _fit(algorithm=buffered(), max_steps=1)
    assert trainer.current_epoch == 1 and trainer.fit_loop.stop_reason.startswith("max_steps=1 reached in round 0")
    _assert_same(_weights(stopped), _weights(reference))


def test_fast_dev_run_is_one_round_of_one_batch_per_client_with_validation_and_writes_nothing(tmp_path: Path) -> None:
    writes = {"logger": True, "enable_checkpointing": True, "default_root_dir": tmp_path}
    model, trainer = _fit(fast_dev_run=True, **writes)
    assert (trainer.current_epoch, model.steps, model.val_batches) == (1, NUM_CLIENTS, 1)
    assert list(tmp_path.iterdir()) == []
    assert trainer.fit_loop.stop_reason == "fast_dev_run: one round of 1 batch(es) per client, nothing written"
    model, trainer = _fit(fast_dev_run=2, **writes)
    assert (trainer.current_epoch, model.steps, model.val_batches) == (1, 2 * NUM_CLIENTS, 2)


LIMITS = [
    ({"overfit_batches": 1}, 1, 1),
    ({"limit_train_batches": 1}, 1, 3),
    ({"limit_train_batches": 0.5}, 1, 3),
    ({"limit_train_batches": 3, "local_epochs": 2}, 3, 3),  # per round, local epochs included
    ({"limit_train_batches": 1.0, "local_epochs": 2}, 4, 3),
    ({"limit_val_batches": 1}, 2, 1),
    ({"accumulate_grad_batches": 2, "client_executor": "lightning"}, 2, 3),  # 2 batches, 1 optimizer step
]


@pytest.mark.parametrize(("kwargs", "per_client", "val_per_round"), LIMITS)
def test_batch_limits_apply_per_client_per_round(kwargs: dict[str, Any], per_client: int, val_per_round: int) -> None:
    model, trainer = _fit(**kwargs)
    assert model.steps == 3 * NUM_CLIENTS * per_client
    assert model.val_batches == 3 * val_per_round
    steps_per_batch = 1 / kwargs.get("accumulate_grad_batches", 1)
    assert trainer.global_step == model.steps * steps_per_batch


class _FirstBatches(Callback):
    """Records the inputs of every client's first batch, by round."""

    def __init__(self) -> None:
        self.seen: dict[int, list[torch.Tensor]] = {}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            self.seen.setdefault(trainer.current_epoch, []).append(batch[0].clone())


def test_overfit_batches_gives_each_client_the_same_batches_every_round() -> None:
    overfit, limited = _FirstBatches(), _FirstBatches()
    _fit(overfit_batches=1, callbacks=[overfit], client_executor="lightning")
    _fit(limit_train_batches=1, callbacks=[limited], client_executor="lightning")
    same = [all(map(torch.equal, recorder.seen[0], recorder.seen[r])) for recorder in (overfit, limited) for r in (1, 2)]
    assert same == [True, True, False, False]  # limit_train_batches draws a fresh order every round


def test_validation_every_n_rounds_and_the_sanity_check_of_the_initial_global_model() -> None:
    model, _ = _fit(check_val_every_n_epoch=2, max_epochs=4)
    assert model.val_batches == 2 * 3  # rounds 1 and 3, 3 batches each
    model, _ = _fit(num_sanity_val_steps=1, max_epochs=1)
    assert model.val_batches == 1 + 3


class _StopEveryRound(Callback):
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        trainer.should_stop = True


@pytest.mark.parametrize("kwargs", [{"min_epochs": 2}, {"min_steps": ROUND_STEPS + 1}])
def test_min_epochs_and_min_steps_hold_off_a_stop_until_a_round_end(kwargs: dict[str, Any]) -> None:
    model, trainer = _fit(callbacks=[_StopEveryRound()], **kwargs)
    assert (trainer.current_epoch, model.steps) == (2, 2 * ROUND_STEPS)


HONOURED = [
    {"gradient_clip_val": 0.5, "gradient_clip_algorithm": "value"},
    {"deterministic": True},
    {"benchmark": False},
    {"detect_anomaly": True},
    {"inference_mode": False},
    {"log_every_n_steps": 1},
    {"limit_test_batches": 1},
    {"limit_predict_batches": 1},
    {"enable_model_summary": True},
    {"enable_progress_bar": True},
    {"precision": "64-true"},
    {"devices": 1, "num_nodes": 1},
    {"profiler": "simple"},
    {"enable_autolog_hparams": False},
]


@pytest.mark.parametrize("kwargs", HONOURED, ids=[",".join(k) for k in HONOURED])
def test_an_honoured_argument_reaches_lightning_and_the_fit_completes(kwargs: dict[str, Any]) -> None:
    assert all(MEANINGS[name] == "honoured" for name in kwargs)
    model, trainer = _fit(max_epochs=1, **kwargs)
    assert (trainer.current_epoch, model.steps) == (1, ROUND_STEPS)
    for name in ("gradient_clip_val", "log_every_n_steps", "limit_test_batches", "limit_predict_batches", "precision"):
        if name in kwargs:
            assert getattr(trainer, name) == kwargs[name]
    if "precision" in kwargs:
        assert all(p.dtype == torch.float64 for p in model.parameters())


#: Walked by the tests above without a parametrised list of their own.
WALKED_ABOVE = {"fast_dev_run", "check_val_every_n_epoch", "num_sanity_val_steps", "min_epochs", "min_steps", "max_epochs"}
#: Walked by other modules: the distributed strategy (tests/distributed), loggers and checkpoints
#: (tests/integration, tests/test_checkpointing.py), callbacks (tests/callbacks), the default root (tests/integration).
WALKED_ELSEWHERE = {"strategy", "logger", "callbacks", "enable_checkpointing", "default_root_dir", "accelerator"}
#: Passed to Lightning unchanged, with nothing federated about them: not exercised here.
PASSED_THROUGH = {"plugins", "model_registry"}


def test_every_row_of_the_table_is_walked() -> None:
    walked = {name for kwargs, _ in REFUSALS for name in kwargs}
    walked |= {name for kwargs, _ in STOPS.values() for name in kwargs}
    walked |= {name for kwargs, _, _ in LIMITS for name in kwargs} | {name for kwargs in HONOURED for name in kwargs}
    assert walked | WALKED_ABOVE | WALKED_ELSEWHERE | PASSED_THROUGH >= set(MEANINGS)
    assert all(MEANINGS[name] != "refused" for name in PASSED_THROUGH | WALKED_ELSEWHERE)
