"""The batched executor on the local training papers compare: SGD with momentum, Adam and AdamW, step and epoch LR
schedules, FedProx's (one coefficient, or one per client), SCAFFOLD's, FedDyn's and FedSoft's loss terms, local
selections (FedBN's BatchNorm, FedPer's and LG-FedAvg's layers) and encoded uploads, each equal to the Lightning
executor's weights, per-client updates and losses (float64 to 1e-10, float32 to 1e-6), on ragged clients (unequal
steps and batches)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from fl_lightning import (
    SCAFFOLD, CompressedFedAvg, Ditto, FedAvgSM, FedBN, FedDyn, FedMRN, FedMRNS, FedNova, FedPer, FedProx, FedSoft,
    FlexibleParticipation, LGFedAvg,
)  # fmt: skip
from fl_lightning.algorithms.shared.algorithm import ClientContext, ClientUpdate
from fl_lightning.callbacks.federated_callback import FederatedCallback
from fl_lightning.compression import StochasticSignCodec, TopKCodec
from fl_lightning.data._data_checks import ClientDataError
from fl_lightning.loops.batched_executor import BatchedExecutor
from fl_lightning.models import CNN, MLP
from fl_lightning.models.masked_networks import MaskedMLP
from fl_lightning.participation import BinomialSteps

from fl_lightning.mixins.masked_noise import MaskedNoiseMixin

from ..faults.aggregate_helpers import tiny_trainer
from ..federated_models import Tied, tied, token_data
from ..quiet import quiet_trainer
from ..tolerances import cross_path_tolerance
from .test_batched_clients import OrderRecordingFedAvg, fit, max_diff, synthetic_data

#: Weights and updates after 3 rounds equal the Lightning executor's to this, by precision.
TOL = {"64-true": 1e-10, "32-true": 1e-6}
#: Clients' mean losses: both executors average them in float32 (the loss recorder's sums).
LOSS_TOL = 1e-6


class Configured(MLP):
    """An MLP whose optimizer and LR scheduler (with its interval) come from factories."""

    def __init__(self, optimizer: Callable[..., torch.optim.Optimizer], scheduler: Callable[..., Any] | None = None,
                 interval: str = "step") -> None:
        super().__init__(in_features=12, hidden=(16,), num_classes=4)
        self.make_optimizer, self.make_scheduler, self.interval = optimizer, scheduler, interval

    def configure_optimizers(self) -> Any:
        optimizer = self.make_optimizer(self.parameters())
        if self.make_scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.make_scheduler(optimizer), "interval": self.interval}}


P = functools.partial
SGD, Adam, AdamW = torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW
sched = torch.optim.lr_scheduler

OPTIMIZERS: dict[str, Callable[[], Configured]] = {
    "sgd-momentum-dampening-wd": lambda: Configured(P(SGD, lr=0.1, momentum=0.9, dampening=0.3, weight_decay=1e-2)),
    "sgd-nesterov-maximize": lambda: Configured(P(SGD, lr=0.05, momentum=0.8, nesterov=True, maximize=False)),
    "adam": lambda: Configured(P(Adam, lr=0.01)),
    "adam-l2-amsgrad": lambda: Configured(P(Adam, lr=0.01, betas=(0.8, 0.99), weight_decay=0.05, amsgrad=True)),
    "adamw": lambda: Configured(P(AdamW, lr=0.02, weight_decay=0.1)),
    "adamw-steplr-step": lambda: Configured(P(AdamW, lr=0.02), P(sched.StepLR, step_size=2, gamma=0.5)),
    "sgd-cosine-step": lambda: Configured(P(SGD, lr=0.2, momentum=0.5), P(sched.CosineAnnealingLR, T_max=12)),
    "adam-lambda-epoch": lambda: Configured(P(Adam, lr=0.01), P(sched.LambdaLR, lr_lambda=lambda r: 0.5**r), "epoch"),
}


def payload_diff(got: ClientUpdate, want: ClientUpdate) -> float:
    return max_diff(got.payload, want.payload)


def compare(
    model_fn: Callable[[], Any],
    precision: str = "64-true",
    *,
    own_tol: float | None = None,
    update_diff: Callable[[ClientUpdate, ClientUpdate], float] = payload_diff,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """Lightning's and the batched executor's runs (3 rounds of 4 ragged clients, two local epochs): asserts that
    the weights and every update (decoded as the server reads it, ``algorithm.decode_update``: a codec's; then by
    ``update_diff``, default the payloads' largest difference) agree to :data:`TOL`, every client's own tensors
    (``algorithm.personal``, where it keeps them) to ``own_tol`` (default the same), every client's metrics to
    :data:`LOSS_TOL` (relative, for one larger than 1: q-FFL's :math:`h_k`); returns both logs."""
    kwargs = {"max_epochs": 3, "local_epochs": 2, "precision": precision, **kwargs}
    ref_model, ref_log, ref_algorithm = fit("lightning", model_fn, **kwargs)
    model, log, algorithm = fit("batched", model_fn, **kwargs)
    tol = TOL[precision]
    assert log.updates.keys() == ref_log.updates.keys()
    assert len({u.num_steps for u in log.updates.values()}) > 1  # ragged: unequal step counts in one group
    for key, want in ref_log.updates.items():
        got = log.updates[key]
        assert got.num_steps == want.num_steps
        got, want = algorithm.decode_update(got), ref_algorithm.decode_update(want)
        assert update_diff(got, want) <= tol, key
        assert got.metrics.keys() == want.metrics.keys(), key
        for name, value in want.metrics.items():
            assert got.metrics[name] == pytest.approx(value, rel=LOSS_TOL, abs=LOSS_TOL), (key, name)
    assert max_diff(model.state_dict(), ref_model.state_dict()) <= tol
    if hasattr(ref_algorithm, "personal"):
        assert algorithm.personal.ids() == ref_algorithm.personal.ids() != []
        for cid, want_own in ref_algorithm.personal.items():
            assert max_diff(algorithm.personal.get(cid), want_own) <= (own_tol or tol), cid
    return ref_log, log


@pytest.mark.parametrize("precision", ["64-true", "32-true"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_optimizers_and_schedules_equal_lightnings(optimizer: str, precision: str) -> None:
    compare(OPTIMIZERS[optimizer], precision)


def mlp(**kwargs: Any) -> MLP:
    return MLP(in_features=12, hidden=(16,), num_classes=4, lr=0.1, **kwargs)


METHODS: dict[str, Callable[[], Any]] = {
    "fedprox": lambda: FedProx(mu=0.5),
    "scaffold": SCAFFOLD,
    "feddyn": lambda: FedDyn(alpha=0.1),
}


@pytest.mark.parametrize("precision", ["64-true", "32-true"])
@pytest.mark.parametrize("method", list(METHODS))
def test_methods_with_loss_terms_equal_lightnings(method: str, precision: str) -> None:
    ref_log, _ = compare(mlp, precision, algorithm=METHODS[method])
    assert any(u.metrics["train_regularizer"] != 0 for u in ref_log.updates.values())  # the terms acted


#: Methods whose clients train as FedAvg's: a local selection (each client's own layers, in its row of the group, on
#: padded batches) or an upload encoded after training (compared decoded; the codecs' draws are each client's own).
PLAIN_TRAINING_METHODS: dict[str, Callable[[], Any]] = {
    "fedper-head": lambda: FedPer(personal=["net.3"]),
    "lg-fedavg-body": lambda: LGFedAvg(local=["net.1"]),
    "compressed-topk": lambda: CompressedFedAvg(codec=TopKCodec(density=0.5)),
    "compressed-stochastic-sign": lambda: CompressedFedAvg(codec=StochasticSignCodec()),
    "fedavg-sm": FedAvgSM,
}


@pytest.mark.parametrize("precision", ["64-true", "32-true"])
@pytest.mark.parametrize("method", list(PLAIN_TRAINING_METHODS))
def test_methods_without_loss_terms_equal_lightnings(method: str, precision: str) -> None:
    compare(mlp, precision, algorithm=PLAIN_TRAINING_METHODS[method])


#: Step counts unequal from unequal client sizes (two local epochs), or drawn per client and round by a participation
#: model out of ``local_steps`` (0 included: an inactive client) in ``Algorithm.plan_client``, before the groups are made.
DRAWN = {"local_epochs": None, "local_steps": 5}
STEP_PLANS: dict[str, dict[str, Any]] = {
    "fednova-epochs": {"algorithm": FedNova},
    "fednova-participation": {"algorithm": lambda: FedNova(participation=BinomialSteps(0.6)), **DRAWN},
    "flexible-participation": {"algorithm": lambda: FlexibleParticipation(participation=BinomialSteps(0.6)), **DRAWN},
}


@pytest.mark.parametrize("precision", ["64-true", "32-true"])
@pytest.mark.parametrize("plan", list(STEP_PLANS))
def test_methods_that_plan_local_steps_equal_lightnings(plan: str, precision: str) -> None:
    ref_log, _ = compare(lambda: mlp(momentum=0.5), precision, **STEP_PLANS[plan])
    if "participation" in plan:  # the drawn counts, not the data, set the steps
        assert {u.num_steps for u in ref_log.updates.values()} - {5}


class OwnStart(OrderRecordingFedAvg):
    """Starts each client from weights of its own (the global ones moved by 0.01 x its id), declared."""

    configure_client_sets_terms = True
    configure_client_loads_weights = True

    def configure_client(self, client: ClientContext, module: Any, global_state: Any) -> None:
        own = {name: t + 0.01 * client.client_id for name, t in self.federation.local_weights().items()}
        self.federation.load_local_weights(own)


def test_a_configure_client_that_loads_each_clients_weights_equals_lightnings() -> None:
    """Each member of a group starts from its own weights (copied after its configure_client), not the last one's."""
    compare(mlp, algorithm=OwnStart)


def test_fedmrn_with_compiled_steps_is_refused_at_fit_start() -> None:
    def model() -> MaskedMLP:
        return MaskedMLP(in_features=12, hidden=(16,), num_classes=4, lr=0.1)

    with pytest.raises(ValueError, match=r"compile_batched_steps='aot_eager' cannot train MaskedMLP: .*MaskedNoiseMixin"):
        fit("batched", model, algorithm=FedMRN, max_epochs=1, compile_batched_steps="aot_eager")


class GroupSizes:
    """Records the number of clients of every group the batched executor trains."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        train_group = BatchedExecutor._train_group

        def recording(executor: BatchedExecutor, optimizer: Any, streams: Any, *args: Any) -> Any:
            self.sizes.append(len(streams))
            return train_group(executor, optimizer, streams, *args)

        monkeypatch.setattr(BatchedExecutor, "_train_group", recording)


@pytest.mark.parametrize("precision", ["64-true", "32-true"])
@pytest.mark.parametrize("personal_steps", [None, 3])
def test_ditto_equals_lightnings(personal_steps: int | None, precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 1 batched over the group; then the group's personal passes (each client's v_k, loaded in configure_client,
    pulled towards w^t by the proximal term, for the trainer's local work or ``personal_steps``) as one group of their
    own: the stored v_k agree too, and each client's update (its step 1's) is the last its callbacks see."""
    groups = GroupSizes(monkeypatch)
    compare(mlp, precision, algorithm=lambda: Ditto(lam=0.5, personal_steps=personal_steps))
    # Per group of step 1, the group of its personal passes: the fit's first client alone (it measures the
    # activations), then every group of 4 clients.
    assert groups.sizes == [1, 1, 3, 3] + [4, 4] * 2


class TrainsAgain(OrderRecordingFedAvg):
    """Trains each client a second time from its ``client_update`` and reads that run's update."""

    def __init__(self) -> None:
        super().__init__()
        self.again: list[int] = []

    def client_update(self, client: ClientContext, module: Any, delta: Any) -> Any:
        if len(self.again) < 2 and client.client_id not in self.again:
            self.again.append(client.client_id)
            assert self.federation.services.train_client(client.round_idx, client.client_id, seed=client.seed).num_steps
        return super().client_update(client, module, delta)


def test_a_second_run_whose_update_is_read_trains_as_a_group_of_one_and_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    groups = GroupSizes(monkeypatch)
    with pytest.warns(UserWarning, match=r"TrainsAgain.client_update trains its client again .* a group of one client"):
        fit("batched", mlp, algorithm=TrainsAgain, max_epochs=1, max_batched_clients=4)
    assert groups.sizes == [4, 1, 1]


def batch_norm_cnn() -> CNN:
    return CNN(in_channels=1, image_size=8, num_classes=4, batch_norm=True, lr=0.05, momentum=0.5)


def batch_norm_mlp(*layers: nn.Module) -> MLP:
    """:func:`mlp` (SGD with momentum) whose network is ``layers``."""
    model = mlp(momentum=0.5)
    model.net = nn.Sequential(*layers)
    return model


def batch_norm_1d() -> MLP:
    return batch_norm_mlp(nn.Linear(12, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def batch_norm_1d_sequence() -> MLP:
    """BatchNorm1d on (N, C, L): the 12 features as a sequence of one channel."""
    conv = [nn.Unflatten(1, (1, 12)), nn.Conv1d(1, 4, 3, padding=1)]
    return batch_norm_mlp(*conv, nn.BatchNorm1d(4), nn.ReLU(), nn.Flatten(), nn.Linear(48, 4))


#: Padded batches: every client's last batch is partial, so a group's batches are padded. The features' clients (48,
#: 25, 20, 46, 11 and 30 samples) in batches of 13 leave last batches of 4 to 12 samples, none of 1 (which BatchNorm1d
#: on (N, C) cannot normalise) or 2: over 2 values per channel its output is +-1 whatever its input (up to eps), so
#: its input gradient is all cancellation, float32 rounding amplified by 1/sigma (batches of 7: 2.2e-6 apart). The
#: images' clients (7, 30, 27, 43, 16 and 57) in batches of 11 leave 2 to 10 samples (each with 64 or 16 positions).
FEDBN_CASES: dict[str, tuple[Callable[[], Any], dict[str, Any]]] = {
    "batchnorm1d-padded": (batch_norm_1d, {"data": {"batch_size": 13}}),
    "batchnorm1d-sequence-padded": (batch_norm_1d_sequence, {"data": {"batch_size": 13}}),
    "batchnorm2d-cnn-padded": (batch_norm_cnn, {"image": True, "data": {"batch_size": 11}}),
    "batchnorm2d-cnn-equal-batches": (batch_norm_cnn, {"image": True, "data": {"batch_size": 4, "drop_last": True}}),
}

#: FedBN's stored running statistics in float32. The weights agree to TOL, but a batch statistic of a convolution's
#: outputs sums terms that cancel, so one unit in the last place (ulp) of the weights, or another summation order,
#: moves it by several of its own: measured 2.3e-6 to 3.1e-6 with equal batches (up to 17 ulps of the statistic),
#: 6e-7 padded. A running statistic is an exponential average of such one-pass statistics, which shrinks earlier
#: differences instead of carrying them on: one step's cross-path bound (100 ulps), not one per optimizer step.
#: Float64: 7e-15.
RUNNING_STATISTICS_TOL_32 = cross_path_tolerance(torch.float32, steps=1)


@pytest.mark.parametrize("precision", ["64-true", "32-true"])
@pytest.mark.parametrize("case", list(FEDBN_CASES))
def test_fedbn_equals_lightnings(case: str, precision: str) -> None:
    """Each client's own BatchNorm (affine tensors and running statistics, trained in training mode) is loaded into
    its row of the group and stored back from it; a padded batch is normalised with the statistics of the client's
    real samples only: the clients' stores, updates and the global weights agree."""
    model, data = FEDBN_CASES[case]
    own_tol = RUNNING_STATISTICS_TOL_32 if precision == "32-true" else None
    compare(model, precision, own_tol=own_tol, algorithm=FedBN, **data)


def test_a_padded_batch_of_one_sample_under_batch_norm_is_refused_as_lightning_refuses_it() -> None:
    """In batches of 8, client 1's last holds 1 sample (padded in its group): torch's BatchNorm1d cannot normalise
    one value per channel, so both executors raise the same error, naming the client."""
    messages = []
    for executor in ("lightning", "batched"):
        with pytest.raises(ClientDataError, match=r"^Client 1 \(25 samples\) has a batch of 1 sample in round 0") as error:
            fit(executor, batch_norm_1d, algorithm=FedBN, max_epochs=1, local_epochs=2)
        messages.append(str(error.value))
    assert messages[0] == messages[1]


def test_batch_norm_with_compiled_steps_is_refused_at_fit_start() -> None:
    """Compiled steps pad every batch, and torch.compile cannot trace the padded steps' BatchNorm (its vmap rule)."""
    with pytest.raises(ValueError, match=r"compile_batched_steps='aot_eager' cannot train MLP: its BatchNorm layers \(net\.1\)"):
        fit("batched", batch_norm_1d, algorithm=FedBN, max_epochs=1, compile_batched_steps="aot_eager")


def test_fedprox_with_adamw_and_a_step_schedule_equals_lightnings() -> None:
    compare(OPTIMIZERS["adamw-steplr-step"], algorithm=lambda: FedProx(mu=0.5))


def test_a_term_set_for_equal_batches_equals_lightnings() -> None:
    """Batches of one shape (no padding): the term is added once per client's batch, not per sample."""
    compare(mlp, algorithm=SCAFFOLD, data={"batch_size": 4, "drop_last": True})


class PerClientMu(FederatedCallback):
    """Sets a proximal coefficient that differs between clients (0 for the clients in ``unset``: no term)."""

    def __init__(self, unset: tuple[int, ...] = ()) -> None:
        self.unset = unset

    def on_client_start(self, trainer: Any, pl_module: Any, client: ClientContext) -> None:
        mu = 0.0 if client.client_id in self.unset else 0.1 * (1 + client.client_id)
        pl_module.set_proximal_center({n: p.detach().clone() for n, p in pl_module.named_parameters()}, mu)


@pytest.mark.parametrize("precision", ["64-true", "32-true"])
def test_a_group_whose_clients_set_different_coefficients_equals_lightnings(precision: str) -> None:
    """Each member's own coefficient, a 0-d tensor stacked per client, scales its own term."""
    ref_log, _ = compare(mlp, precision, algorithm=lambda: FedProx(mu=0.5), callbacks=[PerClientMu()])
    assert any(u.metrics["train_regularizer"] != 0 for u in ref_log.updates.values())


def test_a_group_whose_clients_set_the_term_on_some_only_is_refused() -> None:
    def run(**kwargs: Any) -> None:
        trainer = quiet_trainer(max_epochs=1, clients_per_round=6, client_executor="batched", callbacks=[PerClientMu(unset=(0, 2, 4))], **kwargs)
        trainer.fit(mlp(), datamodule=synthetic_data())

    with pytest.raises(ValueError, match=r"one setting per term; client \d+ has the terms \{(\}|'ProximalMixin': \(\(\), \('\.half_mu',\)\)\})"):
        run(algorithm=FedProx(mu=0.5))
    run(algorithm=FedProx(mu=0.5), max_batched_clients=1)  # groups of one client: nothing to share


@pytest.mark.parametrize("precision", ["64-true", "32-true"])
@pytest.mark.parametrize("lam", [0.5, 0.0])
def test_fedsoft_equals_lightnings(lam: float, precision: str) -> None:
    """Each client starts from its own w_k (loaded in configure_client) and is pulled towards the S centres with its own
    importance weights (coefficient lambda * U_k and constant, stacked per client); the importance is estimated on the
    server before the round's clients train. The uploads (each w_k), the losses and centre 0 agree."""

    def algorithm() -> FedSoft:
        return FedSoft(num_clusters=2, clients_per_cluster=3, lam=lam, tau=2, personal_eval_every=0)

    ref_log, _ = compare(mlp, precision, algorithm=algorithm)
    assert any(u.metrics.get("train_regularizer", 0) != 0 for u in ref_log.updates.values()) == (lam > 0)


#: FedMRN's variants: binary and signed masks, progressive stochastic masking and its two ablations.
MASKED_NOISE: dict[str, Callable[[], Any]] = {
    "fedmrn": FedMRN,
    "fedmrns": FedMRNS,
    "fedmrn-deterministic-sm-only": lambda: FedMRN(stochastic=False, progressive=False),
}


@pytest.mark.parametrize("precision", ["64-true", "32-true"])
@pytest.mark.parametrize("variant", list(MASKED_NOISE))
def test_fedmrn_equals_lightnings(variant: str, precision: str) -> None:
    """Each client's latent update u and noise n stacked in its row, each step's masks and P drawn from its own
    generator as the sequential executors draw them (ragged clients: their own S, padded batches): after 3 rounds the
    uploaded masks agree bit for bit, the biases sent in full precision, the losses and the global weights to float
    rounding."""

    def model() -> MaskedMLP:
        return MaskedMLP(in_features=12, hidden=(16,), num_classes=4, lr=0.1, momentum=0.5)

    kwargs = {"max_epochs": 3, "local_epochs": 2, "precision": precision, "algorithm": MASKED_NOISE[variant]}
    ref_model, ref_log, ref_algorithm = fit("lightning", model, **kwargs)
    got_model, log, algorithm = fit("batched", model, **kwargs)
    tol = TOL[precision]
    assert log.updates.keys() == ref_log.updates.keys()
    assert len({u.num_steps for u in ref_log.updates.values()}) > 1  # ragged: unequal S in one group
    for key, want in ref_log.updates.items():
        got = log.updates[key]
        assert got.num_steps == want.num_steps
        assert got.metrics["train_loss"] == pytest.approx(want.metrics["train_loss"], abs=LOSS_TOL), key
        decoded, want_decoded = algorithm.decode_update(got).payload, ref_algorithm.decode_update(want).payload
        for name in ("net.1.weight", "net.3.weight"):  # n * m: the masks, bit for bit
            assert torch.equal(decoded[name], want_decoded[name]), (key, name)
        assert max_diff(decoded, want_decoded) <= tol, key
    assert max_diff(got_model.state_dict(), ref_model.state_dict()) <= tol


class _MaskedTied(MaskedNoiseMixin, Tied):
    """The tied model (output weight = the embedding) under FedMRN: one latent update for both names."""


def test_fedmrn_on_tied_weights_equals_lightnings() -> None:
    weights = {}
    for executor in ("lightning", "batched"):
        model = tied(_MaskedTied)
        trainer = tiny_trainer(max_epochs=3, precision="64-true", algorithm=FedMRN(), client_executor=executor, clients_per_round=3)
        trainer.fit(model, datamodule=token_data())
        assert model.head.weight is model.embed.weight  # the tie stays
        weights[executor] = model.state_dict()
    assert max_diff(weights["batched"], weights["lightning"]) <= TOL["64-true"]
