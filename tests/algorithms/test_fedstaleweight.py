"""FedStaleWeight's weights and staleness tracker, and fairness on the paper's speed set-up."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fl_lightning.algorithms.shared.algorithm import ClientUpdate
from fl_lightning.algorithms.fedbuff import FedBuff
from fl_lightning.algorithms.fedstaleweight import FedStaleWeight
from fl_lightning.algorithms.shared.staleness import StalenessTracker
from fl_lightning.participation.speed import DelayGroups, UniformDelay

from .quadratic import Quadratic, quadratic_data, quadratic_trainer


def updates(clients, staleness):
    return [ClientUpdate(client_id=c, num_samples=1, num_steps=1, payload={}, upload_bytes=0, staleness=s) for c, s in zip(clients, staleness)]


def bound(algorithm, num_clients=15):
    algorithm.federation = SimpleNamespace(num_clients=num_clients)
    return algorithm


def test_eq8_weights_from_the_notes():
    algorithm = bound(FedStaleWeight(buffer_size=5))
    for client, tau in zip(range(5), [0, 0, 0, 0, 14]):
        algorithm.tracker.record(client, tau)
    assert [algorithm.raw_weight(algorithm.tracker.estimate(c)) for c in range(5)] == pytest.approx(
        [1 / 15] * 4 + [71 / 15]
    )
    algorithm = bound(FedStaleWeight(buffer_size=5, tracker=StalenessTracker(window=1)))
    weights = algorithm.buffer_weights(updates(range(5), [0, 0, 0, 0, 14]))
    assert weights == pytest.approx([1 / 75] * 4 + [71 / 75])
    assert sum(weights) == pytest.approx(1, abs=1e-12)


def test_equal_staleness_gives_fedbuffs_weights():
    fsw = bound(FedStaleWeight(buffer_size=4))
    assert fsw.buffer_weights(updates(range(4), [3, 3, 3, 3])) == pytest.approx(bound(FedBuff(buffer_size=4)).buffer_weights(updates(range(4), [3] * 4)))
    assert bound(FedStaleWeight(buffer_size=1)).buffer_weights(updates([7], [9])) == [1.0]


def test_variants():
    for variant, raw in (("eq8", (5 * 2 + 1) / 15), ("alg1", 3 / 15), ("aflbench", 10 / 15)):
        algorithm = bound(FedStaleWeight(buffer_size=5, variant=variant))
        assert algorithm.raw_weight(2.0) == pytest.approx(raw)
    aflbench = bound(FedStaleWeight(buffer_size=2, variant="aflbench"))
    assert aflbench.buffer_weights(updates([0, 1], [0, 0])) == [0.0, 0.0]  # unchanged model, as in afl-bench


def test_fedbuff_discounts_and_filtering():
    fedbuff = bound(FedBuff(buffer_size=2, staleness_discount="inverse", max_staleness=5))
    assert fedbuff.buffer_weights(updates([0, 1], [1, 9])) == pytest.approx([0.25, 0.0])
    sqrt = bound(FedBuff(buffer_size=1, staleness_discount="inverse_sqrt"))
    assert sqrt.buffer_weights(updates([0], [3])) == pytest.approx([0.5])


def test_tracker_window_drops_the_oldest_and_modes():
    window = StalenessTracker(window=3)
    for tau in (10, 1, 2, 3):
        window.record(0, tau)
    assert window.estimate(0) == pytest.approx(2.0) and window.estimate(9) == 0.0
    ema = StalenessTracker("ema", beta=0.5)
    for tau in (4, 0):
        ema.record(0, tau)
    assert ema.estimate(0) == pytest.approx(2.0)
    cumulative = StalenessTracker("cumulative")
    for tau in (1, 2, 6):
        cumulative.record(0, tau)
    assert cumulative.estimate(0) == pytest.approx(3.0)
    restored = StalenessTracker(window=3)
    restored.load_state_dict(window.state_dict())
    restored.record(0, 7)
    window.record(0, 7)
    assert restored.estimate(0) == window.estimate(0)


def test_aflbench_tracker_keeps_the_first_values_as_the_published_code():
    # afl-bench: `if len(l) >= window: l.pop()` then `l.append(tau)`; by hand for window 3:
    # [1], [1, 2], [1, 2, 3], [1, 2, 4], [1, 2, 5] -> mean 8/3 (a true window would give 4).
    tracker = StalenessTracker("aflbench", window=3)
    for tau in (1, 2, 3, 4, 5):
        tracker.record(0, tau)
    assert tracker.estimate(0) == pytest.approx(8 / 3)
    restored = StalenessTracker("aflbench", window=3)
    restored.load_state_dict(tracker.state_dict())
    restored.record(0, 9)
    assert restored.estimate(0) == pytest.approx(12 / 3)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: StalenessTracker("median"), "must be 'window', 'ema', 'cumulative' or 'aflbench'"),
        (lambda: StalenessTracker(window=0), "`window` must be an integer >= 1, got 0"),
        (lambda: StalenessTracker("ema", beta=1.0), r"`beta` must be in \[0, 1\)"),
        (lambda: FedStaleWeight(variant="eq9"), "`variant` must be 'eq8', 'alg1' or 'aflbench'"),
        (lambda: FedStaleWeight(staleness_discount="inverse"), "leave `staleness_discount` constant"),
    ],
)
def test_bad_input(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# --- the paper's speed set-up through the real loop: 10 fast U(1,2), 5 slow U(8,12), b = 5 ------

PAPER_SPEEDS = dict(sizes=[10, 5], models=[UniformDelay(1.0, 2.0), UniformDelay(8.0, 12.0)])


def slow_share(algorithm_class, aggregations: int = 400, throttle: float = 1.0, **kwargs) -> tuple[float, float]:
    """Slow-group and client-0 shares of the total aggregation weight."""
    fast = UniformDelay(low=[throttle] + [1.0] * 9, high=[2.0 * throttle] + [2.0] * 9)
    delays = DelayGroups(sizes=[10, 5], models=[fast, UniformDelay(8.0, 12.0)])
    algorithm = algorithm_class(buffer_size=5, delays=delays, **kwargs)
    centres = torch.zeros(15, 2, dtype=torch.float64)
    quadratic_trainer(max_epochs=aggregations, algorithm=algorithm, local_steps=1).fit(Quadratic(), datamodule=quadratic_data(centres, samples=2))
    influence = algorithm.influence / algorithm.influence.sum()
    return float(influence[10:].sum()), float(influence[0])


def test_influence_shares_and_throttling():
    # Notes App. B (3,000 aggregations): FedBuff ~0.07, FedStaleWeight ~0.20; 400 aggregations here.
    fedbuff_slow, fedbuff_fast0 = slow_share(FedBuff)
    fsw_slow, fsw_fast0 = slow_share(FedStaleWeight)
    assert 0.04 < fedbuff_slow < 0.10
    assert 0.15 < fsw_slow < 1 / 3 and fsw_slow > 2.5 * fedbuff_slow
    # Throttling (reporting 4x slower) does not buy client 0 influence under FedStaleWeight.
    _, throttled = slow_share(FedStaleWeight, throttle=4.0)
    assert throttled <= fsw_fast0
    assert np.isfinite([fedbuff_fast0, throttled]).all()
