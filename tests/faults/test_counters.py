"""Issue 15 item 5: aggregated + dropped + rejected = clients, for every algorithm, sync and async."""

from __future__ import annotations

import pytest

from .aggregate_helpers import RoundRecorder, tiny_data, tiny_trainer
from .algorithm_cases import CASES, exported_algorithms


def test_every_exported_algorithm_is_covered():
    assert exported_algorithms() == set(CASES)


@pytest.mark.filterwarnings("ignore:Round 0. client 0 sent")
@pytest.mark.parametrize("cls", list(CASES), ids=[c.__name__ for c in CASES])
def test_counts_add_up_with_one_bad_client(cls):
    make_algorithm, case = CASES[cls]
    recorder = RoundRecorder()
    trainer = tiny_trainer(max_epochs=2, algorithm=make_algorithm(), callbacks=[recorder, case["fault"]()])
    trainer.fit(case["model"](), datamodule=tiny_data(**case.get("data", {})))

    assert len(recorder.metrics) == 2
    for metrics in recorder.metrics:
        counted = sum(metrics[f"round/{kind}_clients"] for kind in ("aggregated", "dropped", "rejected"))
        assert counted == metrics["round/clients"] > 0
    bad = {kind: sum(m[f"round/{kind}_clients"] for m in recorder.metrics) for kind in ("dropped", "rejected")}
    other = "rejected" if case["outcome"] == "dropped" else "dropped"
    assert (bad[case["outcome"]], bad[other]) == (1.0, 0.0)
    assert recorder.metrics[0][f"round/{case['outcome']}_clients"] == 1.0
