"""FedPM through FederatedTrainer: θ is the clients' mask average, exact bytes, malformed
payloads, determinism and resume, and it learns."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from fl_lightning import FedPM
from fl_lightning.compression.wire import as_wire, from_wire
from fl_lightning.models import MLP

from .fedmrn_fixtures import digits, states_under_each_executor, tiny_pm, trainer

D = [64 * 16, 16 * 10]  # the masked weights of tiny_pm
DENSE = 4 * 16 + 1  # BatchNorm weight, bias, running mean and variance, counter


def spy_client_masks(model) -> list[dict[str, torch.Tensor]]:
    """Records each client's uploaded masks and its local BatchNorm weight."""
    records: list[dict[str, torch.Tensor]] = []
    original = model.end_probability_mask_round

    def spy(generator=None):
        bits = original(generator)
        records.append({**bits, "bn": model.net[1].weight.detach().clone()})
        return bits

    model.end_probability_mask_round = spy
    return records


def test_theta_is_the_average_of_the_clients_masks():
    model = tiny_pm(batch_norm=True)
    clients = spy_client_masks(model)
    bn_before = model.net[1].weight.detach().clone()
    trainer(max_epochs=1, clients_per_round=3, local_steps=3, algorithm=FedPM()).fit(model, datamodule=digits())

    assert len(clients) == 3
    state = model.state_dict()
    for name, key in model.mask_probability_names.items():
        # θ = (1/K) Σ_k m_k exactly (Li et al. 2024 §2.2; uniform weights by default).
        assert torch.equal(state[key], torch.stack([c[name] for c in clients]).float().mean(0)), key
        fan_in = state[name][0].numel()  # the frozen network was re-drawn: ±e/√fan_in
        assert state[name].abs().unique().tolist() == pytest.approx([math.e / math.sqrt(fan_in)])
    expected_bn = bn_before + torch.stack([c["bn"] - bn_before for c in clients]).mean(0)
    torch.testing.assert_close(model.net[1].weight.detach(), expected_bn)  # unmasked tensors: FedAvg


def test_sample_weighting():
    model = tiny_pm(batch_norm=True)
    clients = spy_client_masks(model)
    data = digits()
    run = trainer(max_epochs=1, clients_per_round=3, local_steps=2, algorithm=FedPM(weighting="samples"))
    run.fit(model, datamodule=data)
    sizes = torch.tensor([float(data.client_num_samples(c)) for c in run.fit_loop.history[0]])
    for name, key in model.mask_probability_names.items():
        masks = torch.stack([c[name] for c in clients]).float()
        expected = (masks * sizes.view(-1, 1, 1)).sum(0) / sizes.sum()
        torch.testing.assert_close(model.state_dict()[key], expected)


def test_upload_and_download_bytes_are_exact():
    model = tiny_pm(batch_norm=True)
    algorithm = FedPM()
    run = trainer(max_epochs=2, clients_per_round=3, local_steps=2, algorithm=algorithm)
    run.fit(model, datamodule=digits())
    payload = 4 + sum((d + 7) // 8 for d in D) + 4 * DENSE  # prefix + mask bits + fp32 rest
    assert algorithm.codec.payload_size(algorithm.layout) == payload == 4 + 128 + 20 + 260
    assert run.fit_loop.total_upload_bytes == 2 * 3 * payload
    assert run.fit_loop.total_download_bytes == 2 * 3 * 4 * (sum(D) + DENSE)  # θ and the rest in fp32, no weights
    metrics = run.callback_metrics
    assert metrics["round/payload_bytes"].item() == payload
    assert metrics["round/compression_ratio"].item() == pytest.approx(4 * (sum(D) + DENSE) / payload)
    assert 0 < metrics["round/mask_density"].item() < 1


def corrupting(algorithm: FedPM, corrupt: Callable[[bytes], bytes], clients: set[int]) -> FedPM:
    """Makes ``algorithm`` upload ``corrupt(payload)`` for the given clients."""
    original = algorithm.client_update

    def client_update(client, module, delta):
        update = original(client, module, delta)
        if client.client_id in clients:
            update.payload = as_wire(corrupt(from_wire(update.payload)))
        return update

    algorithm.client_update = client_update  # type: ignore[method-assign]
    return algorithm


CORRUPTIONS = {
    "truncated": lambda p: p[:-1],
    "too-long": lambda p: p + b"\x00",
    "bad-magic": lambda p: b"ZZ" + p[2:],
    "unknown-version": lambda p: p[:2] + b"\x07" + p[3:],
    "other-codec": lambda p: p[:3] + b"\x01" + p[4:],
    "nan-dense": lambda p: p[:-8] + b"\x00\x00\xc0\x7f" + p[-4:],
}


@pytest.mark.filterwarnings("ignore:Round 0. no client update to aggregate")
@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_malformed_payloads_never_change_the_global_model(corrupt):
    before: dict[str, torch.Tensor] = {}

    class Snapshot(Callback):  # the global model after setup (the network is re-drawn there)
        def on_train_epoch_start(self, trainer, pl_module):
            before.update(copy.deepcopy(pl_module.state_dict()))

    model = tiny_pm(batch_norm=True)
    algorithm = corrupting(FedPM(), corrupt, set(range(6)))
    run = trainer(max_epochs=1, clients_per_round=2, local_steps=2, algorithm=algorithm, callbacks=[Snapshot()])
    with pytest.warns(UserWarning, match="undecodable payload|non-finite update"):
        run.fit(model, datamodule=digits())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # A payload that decodes to NaN is dropped; every other corruption is rejected.
    outcome = "dropped" if corrupt is CORRUPTIONS["nan-dense"] else "rejected"
    assert run.callback_metrics[f"round/{outcome}_clients"].item() == 2
    assert run.callback_metrics["round/aggregated_clients"].item() == 0


def fedpm_trainer(**kwargs):
    return trainer(max_epochs=3, clients_per_round=3, local_steps=3, algorithm=FedPM(), seed=5, **kwargs)


def test_same_seed_same_model_and_resume(tmp_path):
    first, second = tiny_pm(batch_norm=True), tiny_pm(batch_norm=True)
    fedpm_trainer().fit(first, datamodule=digits())
    fedpm_trainer().fit(second, datamodule=digits())
    assert all(torch.equal(v, second.state_dict()[k]) for k, v in first.state_dict().items())

    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    fedpm_trainer(callbacks=[checkpoints], enable_checkpointing=True).fit(tiny_pm(batch_norm=True), datamodule=digits())
    resumed = tiny_pm(seed=1, batch_norm=True)  # different init: everything must come from the checkpoint and seed
    run = fedpm_trainer()
    run.fit(resumed, datamodule=digits(), ckpt_path=tmp_path / "epoch=0.ckpt")
    assert run.current_epoch == 3
    assert all(torch.equal(v, resumed.state_dict()[k]) for k, v in first.state_dict().items())
    saved = torch.load(tmp_path / "epoch=0.ckpt", weights_only=False)["state_dict"]
    assert set(first.mask_probability_names.values()) <= saved.keys()  # θ is the global model
    assert not any("scores" in k or "uniform" in k for k in saved)


def test_lean_client_executor_gives_the_same_model():
    lightning, lean = states_under_each_executor(lambda: tiny_pm(batch_norm=True), FedPM)
    assert all(torch.equal(v, lean[k]) for k, v in lightning.items())


def test_it_learns_on_the_digits():
    class Record(Callback):
        def __init__(self) -> None:
            self.loss: list[float] = []
            self.accuracy: list[float] = []

        def on_train_epoch_end(self, trainer, pl_module):
            self.loss.append(float(trainer.callback_metrics["round/train_loss"]))
            self.accuracy.append(float(trainer.callback_metrics["val_acc"]))

    record = Record()
    model = tiny_pm(hidden=64, optimizer="adam", lr=0.1)  # the FedPM authors' optimizer
    run = trainer(max_epochs=5, clients_per_round=3, local_epochs=1, algorithm=FedPM(), callbacks=[record], limit_val_batches=1.0)
    run.fit(model, datamodule=digits(batch_size=16, val_fraction=0.1))
    assert record.loss[-1] < 0.8 * record.loss[0]  # 1.80 -> 1.14 (deterministic)
    assert record.accuracy[-1] > 0.4  # 0.63; chance is 0.1


def test_needs_the_mixin_optimised_scores_and_valid_arguments():
    with pytest.raises(TypeError, match="inherits `fl_lightning.ProbabilityMaskMixin`"):
        trainer(max_epochs=1, algorithm=FedPM()).fit(MLP(in_features=64, hidden=(8,)), datamodule=digits())
    model = tiny_pm()
    model.configure_optimizers = lambda: torch.optim.SGD([model.net[0].weight], lr=0.1)  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="mask scores of .* are not in any optimizer"):
        trainer(max_epochs=1, algorithm=FedPM()).fit(model, datamodule=digits())
    with pytest.raises(ValueError, match=r"`eps` must be in \(0, 0.5\), got 0.5"):
        FedPM(eps=0.5)
    with pytest.raises(ValueError, match="`weight_init` must be one of .*, got 'zeros'"):
        FedPM(weight_init="zeros")  # type: ignore[arg-type]
