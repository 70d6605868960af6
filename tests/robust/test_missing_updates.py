"""An attacker within f whose update is non-finite (dropped by the loop) counts against f instead of shrinking n:
no robust rule aborts the run, synchronous or buffered (issue 24 item 7)."""

from __future__ import annotations

import math

import pytest
import torch
from typing_extensions import override

from fl_lightning import FedBuff
from fl_lightning.server.model_state import State
from fl_lightning.participation.speed import ConstantDelay
from fl_lightning.robust import Attack, Bulyan, Byzantine, CoordinateMedian, Krum, TrimmedMean, rules
from tests.algorithms.quadratic import Quadratic, quadratic_data, quadratic_trainer
from tests.recording_logger import RecordingLogger

CLIENTS = torch.tensor([[float(i % 5), float(i // 5)] for i in range(10)], dtype=torch.float64)


class NaNUpdate(Attack):
    """Sends NaN: the loop drops the update before the rule sees it."""

    @override
    def poison_update(self, delta: State, generator: torch.Generator) -> State:
        return {n: torch.full_like(t, math.nan) if t.is_floating_point() else t for n, t in delta.items()}


# (rule, group size): each at the smallest group its condition allows for f = 1, so one missing update
# would break it if it shrank n: Krum needs n > 2f + 2 = 4, Bulyan n >= 4f + 3 = 7.
RULES = [
    (lambda algorithm: CoordinateMedian(algorithm=algorithm), 5),
    (lambda algorithm: TrimmedMean(beta=0.2, algorithm=algorithm), 5),
    (lambda algorithm: Krum(num_byzantine=1, algorithm=algorithm), 5),
    (lambda algorithm: Krum(num_byzantine=1, num_selected=3, algorithm=algorithm), 5),
    (lambda algorithm: Bulyan(num_byzantine=1, algorithm=algorithm), 7),
]
IDS = ["median", "trimmed-mean", "krum", "multi-krum", "bulyan"]


@pytest.mark.parametrize(("make_rule", "group"), RULES, ids=IDS)
@pytest.mark.parametrize("mode", ["synchronous", "buffered"])
def test_one_non_finite_attacker_within_f_never_aborts_the_run(make_rule, group, mode):
    inner = FedBuff(buffer_size=group, delays=ConstantDelay([1.0] * 10)) if mode == "buffered" else None
    algorithm = Byzantine(attack=NaNUpdate(), fraction=0.1, algorithm=make_rule(inner))
    logger = RecordingLogger()
    trainer = quadratic_trainer(max_epochs=4, algorithm=algorithm, clients_per_round=group, local_steps=2, logger=logger)
    model = Quadratic()
    with pytest.warns(UserWarning, match="non-finite update"):
        trainer.fit(model, datamodule=quadratic_data(CLIENTS))
    dropped = sum(m["round/dropped_clients"] for _, m in logger.records if "round/dropped_clients" in m)
    assert len(algorithm.malicious) == 1 and dropped >= 1  # the attacker took part and was dropped
    assert trainer.current_epoch == 4 and all(torch.isfinite(p).all() for p in model.parameters())


def test_a_missing_update_counts_against_f_in_the_rule():
    """Krum over 4 of 5 expected updates runs with f' = 0: the same as Krum(f = 0) on those 4."""
    krum = Krum(num_byzantine=1)
    krum._group_size = 5  # as set up for clients_per_round = 5
    updates = torch.randn(4, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert krum.byzantine_in(5) == 1 and krum.byzantine_in(4) == 0
    torch.testing.assert_close(krum.combine(updates), rules.multi_krum(updates, 0), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"n > 2f \+ 2"):  # what it did before: f = 1 on 4 updates
        rules.multi_krum(updates, 1)


@pytest.mark.parametrize(
    ("make_rule", "group", "arrive", "needs"),
    [
        (lambda a: Krum(num_byzantine=1, algorithm=a), 5, 2, "n > 2f \\+ 2"),
        (lambda a: Bulyan(num_byzantine=1, algorithm=a), 7, 2, "n >= 4f \\+ 3"),
    ],
    ids=["krum-2-of-5", "bulyan-2-of-7"],
)
def test_too_few_updates_for_the_rule_skip_the_round_with_the_model_unchanged(make_rule, group, arrive, needs):
    """Issue 38 item 7: the attackers send NaN, so `arrive` updates reach the rule, too few for its condition even
    with f' = 0; the round is skipped (model unchanged, `round/robust_skipped` = 1, a warning), never aborted."""
    algorithm = Byzantine(attack=NaNUpdate(), fraction=(group - arrive) / group, algorithm=make_rule(None))
    logger = RecordingLogger()
    trainer = quadratic_trainer(max_epochs=2, algorithm=algorithm, clients_per_round=group, local_steps=2, logger=logger)
    model = Quadratic()
    before = model.w.detach().clone()
    with pytest.warns(UserWarning, match=f"needs {needs} updates but {arrive} of {group} arrived.*the round is skipped"):
        trainer.fit(model, datamodule=quadratic_data(CLIENTS[:group]))
    rounds = [m for _, m in logger.records if "round/robust_skipped" in m]
    assert trainer.current_epoch == 2
    assert [(r["round/aggregated_clients"], r["round/robust_skipped"]) for r in rounds] == [(float(arrive), 1.0)] * 2
    assert torch.equal(model.w.detach(), before)


def test_the_skip_leaves_global_and_server_state_untouched():
    from fl_lightning import FedAvg, ServerSGD

    krum = Krum(num_byzantine=1, algorithm=FedAvg(server_optimizer=ServerSGD(lr=1.0, momentum=0.9)))
    krum._group_setting, krum._group_size = "clients_per_round", 5
    state = {"w": torch.zeros(2, dtype=torch.float64)}
    from fl_lightning.algorithms.shared.algorithm import ClientUpdate

    updates = [ClientUpdate(client_id=i, num_samples=1, num_steps=1, payload={"w": torch.ones(2, dtype=torch.float64)}, upload_bytes=0) for i in range(2)]
    with pytest.warns(UserWarning, match="Krum needs n > 2f \\+ 2 updates but 2 of 5 arrived"):
        metrics = krum.aggregate(0, state, updates)
    assert metrics == {"robust_skipped": 1.0} and torch.equal(state["w"], torch.zeros(2, dtype=torch.float64))
