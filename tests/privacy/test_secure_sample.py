"""Secure mode's client sample (issue 38 items 2, 3): drawn from the secret, named in no log or checkpoint file,
and a resume from an older checkpoint accounts every round released after it."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from fl_lightning import DPFedAvg, FederatedParameters
from fl_lightning.privacy.ledger import Ledger
from fl_lightning.privacy.release_log import ReleaseLog
from tests.algorithms.quadratic import Quadratic, quadratic_data, quadratic_trainer
from tests.privacy.conftest import make_federation

CLIENTS, PER_ROUND, ROUNDS = 60, 3, 7


@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_the_secure_sample_is_not_the_seeds_and_is_uniform(sampling):
    federation = make_federation(clients_per_round=2)
    research, secure = (DPFedAvg(noise_multiplier=1.0, sampling=sampling, secure_mode=mode) for mode in (False, True))
    with pytest.warns(UserWarning, match="secure_mode"):
        research.setup(federation)
    secure.setup(federation)
    rounds = range(2000)
    seeded, secret = [research.select_clients(r) for r in rounds], [secure.select_clients(r) for r in rounds]
    # 6 subsets of 2 of 4 (fixed; 16 for Poisson): equal by chance about 1 round in 6, not every round.
    assert sum(a == b for a, b in zip(seeded, secret)) < 500
    counts = np.bincount([c for clients in secret for c in clients], minlength=4) / len(rounds)
    np.testing.assert_allclose(counts, 0.5, atol=0.05)  # each client in a round with q = 2/4: se 0.011
    if sampling == "fixed":
        assert all(len(c) == 2 and c == sorted(set(c)) for c in secret)


def _fit(tmp_path: Path, secure_mode: bool, *, max_epochs: int = ROUNDS, ckpt_path: str | None = None, name: str = "run"):
    torch.manual_seed(0)
    centres = torch.randn(CLIENTS, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    algorithm = DPFedAvg(noise_multiplier=1.0, clip_norm=1.0, secure_mode=secure_mode)
    checkpoints = ModelCheckpoint(dirpath=tmp_path / name / "checkpoints", every_n_epochs=1, save_top_k=-1, filename="{epoch}")
    trainer = quadratic_trainer(
        algorithm=algorithm,
        clients_per_round=PER_ROUND,
        max_epochs=max_epochs,
        seed=5,
        logger=CSVLogger(tmp_path, name=name),
        callbacks=[checkpoints],
        enable_checkpointing=True,
    )
    trainer.fit(Quadratic(), datamodule=quadratic_data(centres), ckpt_path=ckpt_path)
    return trainer, algorithm


def _id_lists(value: Any) -> list[list[int]]:
    """Every list (or 1-d integer tensor) of integers anywhere inside a loaded checkpoint."""
    if isinstance(value, dict):
        return [found for v in value.values() for found in _id_lists(v)]
    if isinstance(value, (list, tuple)):
        here = [list(value)] if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value) else []
        return here + [found for v in value for found in _id_lists(v)]
    if isinstance(value, torch.Tensor) and value.dim() == 1 and not value.is_floating_point():
        return [value.tolist()]
    return []


@pytest.mark.filterwarnings("ignore:.*secure_mode")
def test_no_log_or_checkpoint_file_names_the_secure_sample(tmp_path):
    trainer, _ = _fit(tmp_path, secure_mode=True)
    samples = trainer.fit_loop.history
    assert len(samples) == ROUNDS and all(len(s) == PER_ROUND for s in samples)
    research, _ = _fit(tmp_path / "research", secure_mode=False)
    assert samples != research.fit_loop.history  # same seed, another sample
    spellings = {f(s) for s in samples for f in (str, lambda s: ",".join(map(str, s)), lambda s: " ".join(map(str, s)))}
    files = [Path(root, name) for root, _, names in os.walk(tmp_path / "run") for name in names]
    assert {p.suffix for p in files} >= {".ckpt", ".csv", ".yaml", ".pt"}  # checkpoints, metrics, hparams, release log
    for path in files:
        if path.suffix in (".ckpt", ".pt"):
            loaded = torch.load(path, weights_only=False)
            assert not [ids for ids in _id_lists(loaded) if ids in samples], path
        else:
            text = path.read_text()
            assert not [s for s in spellings if s in text], path
    saved = torch.load(tmp_path / "run" / "checkpoints" / f"epoch={ROUNDS - 1}.ckpt", weights_only=False)
    assert saved["loops"]["fit_loop"]["state_dict"]["federated"]["history"] == [[]] * ROUNDS  # the rounds, not who took part


def test_a_secure_resume_from_an_older_checkpoint_accounts_every_release(tmp_path):
    """The audit: resumed from round 3 after 7 releases, ε was ε(4) = 23.50 although 7 rounds were released, then
    3 more. The release log makes it ε of every release: 7 + 3."""
    _, first = _fit(tmp_path, secure_mode=True)
    assert first.rounds_spent == ROUNDS
    older = tmp_path / "run" / "checkpoints" / "epoch=3.ckpt"  # after 4 releases
    trainer, resumed = _fit(tmp_path, secure_mode=True, ckpt_path=str(older), name="resumed")
    assert resumed.rounds_spent == ROUNDS + 3 and len(trainer.fit_loop.history) == ROUNDS
    assert float(trainer.callback_metrics["round/dp_epsilon"]) == pytest.approx(resumed.accountant.epsilon(ROUNDS + 3), rel=1e-6)
    assert resumed.accountant.epsilon(ROUNDS + 3) > resumed.accountant.epsilon(ROUNDS) > resumed.accountant.epsilon(4)

    # The latest checkpoint resumes from there: its ledger is a prefix of the log's.
    latest = tmp_path / "resumed" / "checkpoints" / f"epoch={ROUNDS - 1}.ckpt"
    trainer, again = _fit(tmp_path, secure_mode=True, max_epochs=ROUNDS + 1, ckpt_path=str(latest), name="again")
    assert again.rounds_spent == ROUNDS + 4


def test_a_missing_or_foreign_release_log_is_one_error_naming_it(tmp_path):
    algorithm = DPFedAvg(noise_multiplier=1.0, clip_norm=1.0, secure_mode=True)
    algorithm.setup(make_federation(clients_per_round=2))
    algorithm.spent = Ledger((((1.0, 4.0, 2.0), 3),))
    log = ReleaseLog(str(tmp_path / "dp_releases_x.pt"))
    state = {**copy.deepcopy(algorithm.state_dict()), "release_log": log.path}
    with pytest.raises(ValueError, match=r"release log .*dp_releases_x\.pt is missing"):
        algorithm.load_state_dict(state)
    log.record(Ledger((((1.0, 4.0, 2.0), 2),)))  # fewer releases than the checkpoint: another run's
    with pytest.raises(ValueError, match=r"do not extend the checkpoint's"):
        algorithm.load_state_dict(state)
    log.record(Ledger((((1.0, 4.0, 2.0), 5), ((2.0, 4.0, 2.0), 1))))
    algorithm.load_state_dict(state)
    assert algorithm.rounds_spent == 6


def test_per_client_state_is_refused_with_a_secret_sample(tmp_path):
    class WithHead(Quadratic):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))

    trainer = quadratic_trainer(
        algorithm=DPFedAvg(noise_multiplier=1.0, secure_mode=True),
        clients_per_round=2,
        max_epochs=1,
        federated_parameters=FederatedParameters(local=["head"]),
    )
    with pytest.raises(ValueError, match=r"draws each round's clients from a secret.*local tensors"):
        trainer.fit(WithHead(), datamodule=quadratic_data())
