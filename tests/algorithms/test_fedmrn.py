"""FedMRN through FederatedTrainer: exact bytes, bit-exact reconstruction, eq. 5, malformed
payloads, PSM schedule, determinism and resume."""

from __future__ import annotations

import copy
from contextlib import nullcontext

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import FedAvg, FedMRN, FedMRNS
from fl_lightning.algorithms.shared.algorithm import ClientUpdate
from fl_lightning.compression import masked_noise
from fl_lightning.compression.wire import WIRE_KEY, as_wire, from_wire
from fl_lightning.models import MLP

from .fedmrn_fixtures import digits, states_under_each_executor, tiny, trainer

MASKED = ["net.0.weight", "net.3.weight"]


def spy_client_updates(model, mask: str) -> list[dict[str, torch.Tensor]]:
    """Records each client's own n ⊙ m (from its noise buffers and final masks)."""
    records: list[dict[str, torch.Tensor]] = []
    original = model.end_masked_noise_round

    def spy(generator=None):
        noise = {n: h.noise(local).clone() for n, (_, local, h) in model._masked_owners.items()}
        bits = original(generator)
        records.append({n: masked_noise(bits[n], noise[n], mask) for n in bits})
        return bits

    model.end_masked_noise_round = spy
    return records


@pytest.mark.parametrize("algorithm", [FedMRN, FedMRNS], ids=["binary", "signed"])
def test_one_client_round_is_bit_exact_and_bytes_are_exact(algorithm):
    model = tiny(batch_norm=True)
    before = copy.deepcopy(model.state_dict())
    alg = algorithm(weighting="uniform")
    client_side = spy_client_updates(model, alg.codec.mask)
    run = trainer(max_epochs=1, clients_per_round=1, local_steps=4, algorithm=alg)
    run.fit(model, datamodule=digits())

    after = model.state_dict()
    assert len(client_side) == 1
    for name in MASKED:  # eq. 5 with one client: w + n ⊙ m, bit for bit
        assert torch.equal(after[name], before[name] + client_side[0][name]), name
    assert not torch.equal(after["net.1.weight"], before["net.1.weight"])  # BN affine is averaged in fp32
    assert after["net.1.num_batches_tracked"].item() == 4

    d = [64 * 16, 16 * 10]
    dense = 4 * 16 + 1  # BN weight, bias, running mean/var, counter
    assert run.fit_loop.total_upload_bytes == 18 + sum((x + 7) // 8 for x in d) + 4 * dense
    assert run.fit_loop.total_download_bytes == 4 * (sum(d) + 4 * 16) + 8


def test_server_decoding_equals_client_update():
    model = tiny()
    client_side = spy_client_updates(model, "binary")
    payloads: list[bytes] = []

    class Recording(FedMRN):
        def decode_update(self, update):
            payloads.append(from_wire(update.payload))
            return super().decode_update(update)

    alg = Recording()
    trainer(max_epochs=2, clients_per_round=3, local_epochs=1, algorithm=alg).fit(model, datamodule=digits())
    assert len(payloads) == len(client_side) == 6
    for payload, expected in zip(payloads, client_side):
        decoded = alg.codec.decode(payload, alg.layout)
        assert all(torch.equal(decoded[n], expected[n]) for n in model.masked_parameter_names)
        assert len(payload) == alg.codec.payload_size(alg.layout) == 18 + 128 + 20


def test_psm_schedule_follows_the_clients_steps():
    model = tiny()
    data = digits(num_clients=3)
    trainer(max_epochs=1, clients_per_round=3, local_epochs=2, algorithm=FedMRN()).fit(model, datamodule=data)
    data.setup("fit")
    expected: list[float] = []
    for cid in range(3):  # clients train in id order
        steps = 2 * -(-data.client_num_samples(cid) // 32)
        expected += [(tau + 1) / steps for tau in range(steps)]
    assert model.probabilities == pytest.approx(expected)
    assert all(p.requires_grad for n, p in model.named_parameters() if n in MASKED)  # unfrozen after the round


def test_psm_counts_optimizer_steps_under_gradient_accumulation():
    model = tiny()
    trainer(max_epochs=1, clients_per_round=1, local_steps=2, accumulate_grad_batches=2, algorithm=FedMRN()).fit(
        model, datamodule=digits()
    )
    assert model.probabilities == [0.5, 0.5, 1.0, 1.0]


class Corrupting(FedMRN):
    """Sends a corrupted payload for the clients in ``bad``."""

    def __init__(self, bad: dict[int, object], **kwargs) -> None:
        super().__init__(**kwargs)
        self.bad = bad

    def client_update(self, client, module, delta) -> ClientUpdate:
        update = super().client_update(client, module, delta)
        corrupt = self.bad.get(client.client_id)
        if corrupt is not None:
            update.payload = as_wire(corrupt(from_wire(update.payload)))  # type: ignore[operator]
        return update


class Dropping(FedMRN):
    def __init__(self, drop: set[int], **kwargs) -> None:
        super().__init__(**kwargs)
        self.drop = drop

    def aggregate(self, round_idx, global_state, updates):
        return super().aggregate(round_idx, global_state, [u for u in updates if u.client_id not in self.drop])


CORRUPTIONS = {
    "truncated": lambda p: p[:-1],
    "too-long": lambda p: p + b"\x00",
    "bad-magic": lambda p: b"ZZ" + p[2:],
    "unknown-version": lambda p: p[:2] + b"\x07" + p[3:],
    "wrong-mask-type": lambda p: p[:4] + b"\x01" + p[5:],
}


@pytest.mark.filterwarnings("ignore:Round 0. no client update to aggregate")
@pytest.mark.parametrize("corrupt", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_malformed_payloads_never_change_the_global_model(corrupt):
    model = tiny(batch_norm=True)
    before = copy.deepcopy(model.state_dict())
    alg = Corrupting({cid: corrupt for cid in range(6)})
    run = trainer(max_epochs=1, clients_per_round=2, local_steps=2, algorithm=alg)
    with pytest.warns(UserWarning, match="undecodable payload"):
        run.fit(model, datamodule=digits())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert run.callback_metrics["round/rejected_clients"].item() == 2


def test_one_malformed_payload_is_dropped_alone():
    runs = []
    for alg in (Corrupting({0: CORRUPTIONS["truncated"], 1: CORRUPTIONS["truncated"]}), Dropping({0, 1})):
        model = tiny()
        run = trainer(max_epochs=1, clients_per_round=6, local_steps=2, algorithm=alg)
        with pytest.warns(UserWarning, match="undecodable") if isinstance(alg, Corrupting) else nullcontext():
            run.fit(model, datamodule=digits())
        runs.append(model.state_dict())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    assert not torch.equal(runs[0]["net.0.weight"], tiny().state_dict()["net.0.weight"])


def test_same_seed_same_model_and_resume(tmp_path):
    def run_once():
        model = tiny()
        trainer(max_epochs=3, clients_per_round=3, local_steps=3, algorithm=FedMRN(), seed=5).fit(model, datamodule=digits())
        return model

    first, second = run_once(), run_once()
    assert all(torch.equal(v, second.state_dict()[k]) for k, v in first.state_dict().items())

    checkpoints = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    trainer(
        max_epochs=3,
        clients_per_round=3,
        local_steps=3,
        algorithm=FedMRN(),
        seed=5,
        callbacks=[checkpoints],
        enable_checkpointing=True,
    ).fit(tiny(), datamodule=digits())
    resumed = tiny(seed=1)  # different init: everything must come from the checkpoint
    run = trainer(max_epochs=3, clients_per_round=3, local_steps=3, algorithm=FedMRN(), seed=5)
    run.fit(resumed, datamodule=digits(), ckpt_path=tmp_path / "epoch=0.ckpt")
    assert run.current_epoch == 3
    assert all(torch.equal(v, resumed.state_dict()[k]) for k, v in first.state_dict().items())
    saved = torch.load(tmp_path / "epoch=0.ckpt", weights_only=False)["state_dict"]
    assert not any("latent_update" in k for k in saved)  # u never reaches a checkpoint


def test_needs_the_mixin_and_an_optimised_latent_update():
    with pytest.raises(TypeError, match="inherits `fl_lightning.MaskedNoiseMixin`"):
        trainer(max_epochs=1, algorithm=FedMRN()).fit(MLP(in_features=64, hidden=(8,)), datamodule=digits())

    model = tiny()
    # self.net.parameters() would do (the latent updates are children of the Linear layers); this list does not.
    model.configure_optimizers = lambda: torch.optim.SGD([model.net[0].weight], lr=0.1)  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="not in any optimizer"):
        trainer(max_epochs=1, algorithm=FedMRN()).fit(model, datamodule=digits())


def test_mixin_is_inert_under_fedavg():
    masked, plain = tiny(), tiny()
    plain_net = copy.deepcopy(plain.net)
    trainer(max_epochs=1, clients_per_round=2, local_steps=2, algorithm=FedAvg()).fit(masked, datamodule=digits())
    assert not torch.equal(masked.net[0].weight, plain_net[0].weight)  # masked weights train normally
    assert WIRE_KEY not in masked.state_dict()


def test_lean_client_executor_gives_the_same_model():
    lightning, lean = states_under_each_executor(lambda: tiny(batch_norm=True), FedMRN)
    assert all(torch.equal(v, lean[k]) for k, v in lightning.items())
