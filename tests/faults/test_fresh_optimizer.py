"""Issue 39 item 5: every algorithm whose math assumes a fresh local optimizer refuses reset_optimizer=False at
fit start, with one error naming both; every other algorithm runs with it."""

from __future__ import annotations

import pytest

from fl_lightning import SCAFFOLD, Ditto, DPFedAvg, FedNova
from fl_lightning.algorithms.shared.algorithm import check_fresh_optimizer
from fl_lightning.algorithms.shared.wrapper import AlgorithmWrapper

from .aggregate_helpers import finite, tiny_data, tiny_trainer
from .algorithm_cases import CASES

#: Declared through ``Algorithm.needs_fresh_optimizer``: FedNova's ||a_i||_1, Ditto's personal pass, SCAFFOLD's option II.
#: FedDyn (its h and gradient state follow from the local minimiser, however reached) and FedMRN (progressive
#: masking counts its own steps, restarted with u = 0 every round) run with carried optimizer state.
REFUSING = {FedNova, Ditto, SCAFFOLD}


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("cls", list(CASES), ids=[c.__name__ for c in CASES])
def test_every_algorithm_runs_or_refuses_carried_optimizer_state(cls):
    make_algorithm, case = CASES[cls]
    model = case["model"]()
    trainer = tiny_trainer(max_epochs=1, algorithm=make_algorithm(), reset_optimizer=False)
    if cls in REFUSING:
        with pytest.raises(ValueError, match=rf"^{cls.__name__} refuses reset_optimizer=False: .*Use reset_optimizer=True\.$"):
            trainer.fit(model, datamodule=tiny_data(**case.get("data", {})))
        assert trainer.fit_loop.epoch_progress.current.completed == 0  # refused before any round
    else:
        trainer.fit(model, datamodule=tiny_data(**case.get("data", {})))
        assert finite(model)


def test_a_wrapper_forwards_the_wrapped_algorithms_declaration():
    assert AlgorithmWrapper(FedNova()).needs_fresh_optimizer == FedNova.needs_fresh_optimizer != ""
    with pytest.raises(ValueError, match=r"^AlgorithmWrapper refuses reset_optimizer=False: FedNova's normaliser"):
        check_fresh_optimizer(AlgorithmWrapper(FedNova()), reset_optimizer=False)
    assert DPFedAvg(noise_multiplier=0.5, clip_norm=1.0).needs_fresh_optimizer == ""
