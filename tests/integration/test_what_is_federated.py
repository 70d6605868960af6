"""Issue 37's acceptance matrix: what is federated (shared), never touched (frozen) or kept per client (local).

1. A frozen base under every exported algorithm: frozen tensors bit-identical after the fit, uploads of the
   shared tensors only, no frozen name in any algorithm state.
2. The same under central and local DP, DP-FedBuff, secure aggregation, an update bound and a server optimizer
   with moments; the noise reaches every shared tensor and no frozen one.
3. Tied weights (an embedding that is the output layer): one tensor, stepped by the server optimizer, sent and
   masked once, the tie kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch

from fl_lightning import (
    SCAFFOLD,
    Algorithm,
    DPFedAvg,
    FedAvg,
    FedBN,
    CoordinateMedian,
    FedBuff,
    FedDyn,
    FedEM,
    FedMRN,
    FedPer,
    FedPM,
    LGFedAvg,
    LocalOnly,
    NormClip,
    QFedAvg,
    ServerAdam,
    ServerSGD,
)
from fl_lightning.participation import ConstantDelay
from fl_lightning.privacy import DPFedBuff, LocalDP
from fl_lightning.secure import SecureAggregation

from ..faults.aggregate_helpers import RoundRecorder, tiny_data, tiny_trainer
from ..faults.algorithm_cases import CASES, compressed
from ..federated_models import FROZEN, SHARED, TIED_SHARED, MaskedTied, adapter, tied, token_data

FLOAT32 = 4


def names_in(state: Any) -> set[str]:
    """Every string key anywhere in a nested state (dicts, lists, tuples)."""
    if isinstance(state, Mapping):
        return {k for k in state if isinstance(k, str)}.union(*map(names_in, state.values()))
    if isinstance(state, list | tuple):
        return set().union(*map(names_in, state))
    return set()


def every_state(trainer: Any) -> Any:
    """What the run keeps besides the module: the loop's checkpoint entry (the algorithm's state, the master copy,
    the local tensors) and the live per-client stores."""
    algorithm = trainer.fit_loop.algorithm
    stores = {path: dict(store.items()) for path, store in algorithm.client_stores().items()}
    return {"checkpoint": trainer.fit_loop.on_save_checkpoint()["federated"], "stores": stores}


def fit(make_algorithm: Callable[[], Algorithm], model: Any, rounds: int = 2, data: dict | None = None, **kwargs: Any):
    initial = {name: t.clone() for name, t in model.state_dict().items()}
    recorder = RoundRecorder()
    trainer = tiny_trainer(max_epochs=rounds, algorithm=make_algorithm(), callbacks=[recorder], **kwargs)
    trainer.fit(model, datamodule=tiny_data(**(data or {})))
    assert len(recorder.metrics) == rounds
    return initial, trainer, recorder


def per_client_upload(recorder: RoundRecorder) -> set[float]:
    return {m["round/upload_bytes"] / m["round/clients"] for m in recorder.metrics if m["round/clients"]}


def assert_frozen_untouched(trainer: Any, model: Any, initial: dict, frozen: tuple[str, ...] = FROZEN) -> None:
    """``frozen`` are the module's frozen tensors, bit-identical to ``initial``, and in no state of the run."""
    kinds = trainer.fit_loop.kinds
    assert set(kinds.frozen) == set(frozen)
    state = model.state_dict()
    for name in frozen:
        assert torch.equal(state[name], initial[name]), name
    assert set(trainer.fit_loop.global_state) == set(kinds.shared)
    assert not names_in(every_state(trainer)) & set(frozen)


def shared_bytes(model: Any, names: tuple[str, ...] = SHARED, size: int = FLOAT32) -> int:
    return sum(model.state_dict()[n].numel() for n in names) * size


#: Per-client upload of a dense algorithm, in units of the shared tensors' float32 bytes (and extra bytes).
DENSE_UPLOAD: dict[type, Callable[[int], int]] = {
    SCAFFOLD: lambda b: 2 * b,  # the delta and the control variate's
    FedEM: lambda b: 2 * b,  # one delta per component (2)
    QFedAvg: lambda b: b + 4,  # and h_k as one float32
    LocalOnly: lambda b: 0,
}
#: FedPM learns masks over a random network it draws at set-up and never trains: those weights are frozen too.
RANDOM_NETWORK = ("net.adapter.weight", "net.head.weight")
#: Per case, its selection where it is not the frozen base's: (frozen, local).
SELECTIONS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {
    FedBN: (FROZEN[:2], FROZEN[2:]),
    FedPer: (FROZEN, ("net.head.weight", "net.head.bias")),
    LGFedAvg: (FROZEN, ("net.adapter.weight", "net.adapter.bias")),
    FedPM: (FROZEN + RANDOM_NETWORK, ()),
}
COMPRESSED = {cls for cls, (_, case) in CASES.items() if case["fault"] is compressed()["fault"]}


@pytest.mark.filterwarnings("ignore:Round 0. no client update")
@pytest.mark.parametrize("cls", list(CASES), ids=[c.__name__ for c in CASES])
def test_a_frozen_base_is_never_trained_sent_or_kept_in_state(cls):
    make_algorithm, case = CASES[cls]
    model = case["frozen_model"]()
    initial, trainer, recorder = fit(make_algorithm, model, data=case.get("data"))
    frozen, local = SELECTIONS.get(cls, (FROZEN, ()))
    kinds = trainer.fit_loop.kinds
    assert set(kinds.local) == set(local)
    # FedPM's random network is drawn at set-up: frozen from then on.
    assert_frozen_untouched(trainer, model, {**initial, **recorder.before[0]} if cls is FedPM else initial, frozen)
    shared = tuple(n for n in model.state_dict() if n not in frozen + local)
    assert kinds.shared == shared
    if cls is not LocalOnly:  # its global model never changes
        assert any(not torch.equal(model.state_dict()[n], initial[n]) for n in shared)
    uploads = per_client_upload(recorder)
    if cls in COMPRESSED:  # a codec's bytes: those of a model holding the shared tensors alone
        _, _, alone = fit(make_algorithm, case["frozen_model"](without_base=True), data=case.get("data"))
        assert uploads == per_client_upload(alone)
    else:
        expected = DENSE_UPLOAD.get(cls, lambda b: b)(shared_bytes(model, shared))
        assert uploads == {expected}
    for state in STATE_OF.get(cls, lambda algorithm: [])(trainer.fit_loop.algorithm):
        assert set(state) == set(shared)


#: Per-tensor algorithm state that must cover exactly the shared tensors (the server's and every client's).
STATE_OF: dict[type, Callable[[Any], list[Mapping]]] = {
    SCAFFOLD: lambda a: [a.control, *(c for _, c in a.client_controls.items())],
    FedDyn: lambda a: [a.h, *(g for _, g in a.gradients.items())],
}


#: Wrappers that add noise: with a negligible learning rate, only their noise moves the global model (their
#: client statistics logged, to read the upload bytes per client).
NOISY: dict[str, tuple[Callable[[], Algorithm], dict[str, Any]]] = {
    "DPFedAvg-fixed": (lambda: DPFedAvg(noise_multiplier=1.0, clip_norm=1.0, log_client_statistics=True), {}),
    "DPFedAvg-poisson": (lambda: DPFedAvg(noise_multiplier=1.0, clip_norm=1.0, log_client_statistics=True, sampling="poisson"), {"clients_per_round": 2}),
    "LocalDP": (lambda: LocalDP(noise_multiplier=1.0, clip_norm=1.0, log_client_statistics=True), {}),
    "DPFedBuff": (
        lambda: DPFedBuff(noise_multiplier=1.0, clip_norm=1.0, log_client_statistics=True, algorithm=FedBuff(buffer_size=2, delays=ConstantDelay(1.0))),
        {},
    ),
    "LocalDP-CoordinateMedian": (lambda: LocalDP(noise_multiplier=1.0, clip_norm=1.0, log_client_statistics=True, algorithm=CoordinateMedian()), {}),
}


@pytest.mark.filterwarnings("ignore:.*secure_mode")
@pytest.mark.parametrize("name", list(NOISY))
def test_noise_reaches_every_shared_value_and_no_frozen_one(name):
    make_algorithm, settings = NOISY[name]
    model = adapter(lr=1e-12)  # training moves the shared tensors by ~1e-12: what moves them is noise
    initial, trainer, recorder = fit(make_algorithm, model, **settings)
    assert_frozen_untouched(trainer, model, initial)
    state = model.state_dict()
    for n in SHARED:
        assert ((state[n] - initial[n]).abs() > 1e-6).all(), n
    _, _, alone = fit(make_algorithm, adapter(without_base=True), **settings)
    assert per_client_upload(recorder) == per_client_upload(alone)


def test_secure_aggregation_masks_the_shared_tensors_only():
    model = adapter()
    initial, trainer, recorder = fit(SecureAggregation, model)
    assert_frozen_untouched(trainer, model, initial)
    plain = adapter()
    fit(FedAvg, plain)
    for n in SHARED:  # FedAvg within the fixed-point quantisation
        assert not torch.equal(plain.state_dict()[n], initial[n])
        torch.testing.assert_close(model.state_dict()[n], plain.state_dict()[n], rtol=0, atol=1e-5)
    _, _, alone = fit(SecureAggregation, adapter(without_base=True))
    assert per_client_upload(recorder) == per_client_upload(alone)


def test_an_update_bound_clips_the_shared_delta():
    model = adapter()
    initial, trainer, recorder = fit(FedAvg, model, update_bound=NormClip(max_norm=0.01))
    assert_frozen_untouched(trainer, model, initial)
    step = torch.cat([(recorder.after[0][n] - recorder.before[0][n]).flatten() for n in SHARED])
    assert 0 < float(step.norm()) <= 0.01 * (1 + 1e-5)  # a mean of deltas clipped to 0.01


def test_server_optimizer_moments_cover_the_shared_parameters_only():
    model = adapter()
    initial, trainer, _ = fit(lambda: FedAvg(server_optimizer=ServerAdam(lr=0.05)), model)
    assert_frozen_untouched(trainer, model, initial)
    moments = trainer.fit_loop.algorithm.server_optimizer.state
    assert set(moments) == {"m", "v"} and all(set(m) == set(SHARED) for m in moments.values())


def test_every_client_executor_keeps_a_frozen_batch_norm_per_client():
    """A frozen BatchNorm in training mode updates its statistics on every client (from the initial ones) and
    passes none of it on: under the batched executor too, whose vmap needs each client's own copy."""
    states = {}
    for executor in ("lightning", "lean", "batched"):
        model = adapter()
        initial, trainer, _ = fit(FedAvg, model, client_executor=executor)
        assert_frozen_untouched(trainer, model, initial)
        states[executor] = model.state_dict()
    for executor in ("lightning", "batched"):
        for name, t in states["lean"].items():
            torch.testing.assert_close(states[executor][name], t, rtol=0, atol=1e-6)


def tied_fit(make_algorithm: Callable[[], Algorithm], model: Any = None, **kwargs: Any):
    """One float64 round on the tied model; its global delta by ``state_dict`` name (both tied names)."""
    model = tied() if model is None else model
    recorder = RoundRecorder()
    trainer = tiny_trainer(**{"max_epochs": 1, "precision": "64-true", **kwargs}, algorithm=make_algorithm(), callbacks=[recorder])
    trainer.fit(model, datamodule=token_data())
    delta = {n: recorder.after[0][n] - recorder.before[0][n] for n in recorder.before[0]}
    return model, trainer, recorder, delta


def test_a_tied_weight_is_one_shared_tensor_that_the_server_learning_rate_scales():
    model, trainer, recorder, once = tied_fit(lambda: FedAvg(server_optimizer=ServerSGD(lr=1.0)))
    _, _, _, twice = tied_fit(lambda: FedAvg(server_optimizer=ServerSGD(lr=2.0)))
    kinds = trainer.fit_loop.kinds
    assert kinds.shared == TIED_SHARED and dict(kinds.aliases) == {"head.weight": "embed.weight"}
    assert model.head.weight is model.embed.weight  # the tie stays
    for name, d in once.items():  # every shared tensor, the tied one under both its names, moves 2x as far
        assert d.abs().max() > 1e-4, name
        torch.testing.assert_close(twice[name], 2 * d, rtol=1e-10, atol=1e-14)
    # the tied tensor is sent once (float64 deltas under "64-true")
    assert per_client_upload(recorder) == {shared_bytes(model, TIED_SHARED, size=8)}


def test_fedadam_steps_the_tied_weight():
    _, _, _, mean = tied_fit(FedAvg)
    adam = ServerAdam(lr=0.05)
    _, trainer, _, stepped = tied_fit(lambda: FedAvg(server_optimizer=adam))
    for name, d in mean.items():  # Reddi et al.'s first step from the mean delta, by hand
        m, v = (1 - adam.beta1) * d, adam.beta2 * adam.tau**2 + (1 - adam.beta2) * d**2
        torch.testing.assert_close(stepped[name], adam.lr * m / (v.sqrt() + adam.tau), rtol=1e-9, atol=1e-14)
    assert not torch.allclose(stepped["head.weight"], mean["head.weight"])  # not the plain average
    assert all(set(moment) == set(TIED_SHARED) for moment in trainer.fit_loop.algorithm.server_optimizer.state.values())


def test_scaffold_keeps_one_control_variate_for_the_tied_weight():
    model, trainer, recorder, _ = tied_fit(SCAFFOLD)
    algorithm = trainer.fit_loop.algorithm
    assert set(algorithm.control) == set(TIED_SHARED)
    assert algorithm.client_controls.ids() and all(set(c) == set(TIED_SHARED) for _, c in algorithm.client_controls.items())
    assert per_client_upload(recorder) == {2 * shared_bytes(model, TIED_SHARED, size=8)}
    assert model.head.weight is model.embed.weight


def test_fedmrn_masks_a_tied_weight_once_and_its_alias_computes_with_it():
    model, trainer, recorder, _ = tied_fit(FedMRN, tied(MaskedTied), precision="32-true")
    assert model.masked_parameter_names == ["embed.weight", "mid.weight"]
    assert model.head.weight is model.embed.weight
    assert hasattr(model.head, "latent_update_alias") and not hasattr(model.head, "latent_update")
    # every training forward's output layer used the embedding's effective weight w + u-hat
    assert model.checked and all(model.checked)
    assert trainer.fit_loop.kinds.shared == TIED_SHARED
    layout = trainer.fit_loop.algorithm.layout  # what goes up: masks for the tied weight (once) and mid's
    assert [spec.name for spec in layout.compressed] == ["embed.weight", "mid.weight"]
    assert [spec.name for spec in layout.dense] == ["mid.bias", "head.bias"]
