"""DP in secure mode over 2 processes: every rank draws the same secret Poisson sample and noise (rank 0's secret,
broadcast once), so the ranks agree; the noise is not the seeded noise of a 1-process run (issue 24 item 4)."""

from __future__ import annotations

import torch

from tests.distributed.ddp_run import fit
from tests.distributed.test_ddp_equivalence import finished, max_diff, result


def test_secure_mode_ranks_agree_and_differ_from_the_seeded_run(tmp_path, two_process_runs):
    two = finished(two_process_runs, "dpfedavg-secure")  # the session's 2-process fit
    ranks = [result(two, rank) for rank in (0, 1)]
    assert ranks[0]["history"] == ranks[1]["history"]
    assert max_diff(ranks[0]["global_state"], ranks[1]["global_state"]) == 0.0
    assert all(torch.isfinite(t).all() for t in ranks[0]["global_state"].values() if t.is_floating_point())
    fit(tmp_path / "one", algorithm="dpfedavg-secure", executor="lean")
    assert max_diff(result(tmp_path / "one")["global_state"], ranks[0]["global_state"]) > 1e-3  # another secret
