"""The summary statistics of federated evaluation against NumPy and the documented rules."""

from __future__ import annotations

import numpy as np
import pytest

from fl_lightning.evaluation import (
    ClientEvaluation,
    accuracy_summary,
    grouped_summary,
    loss_summary,
    summarize,
    table_rows,
    weighted_mean,
    worst10_mean,
    worst_count,
)

ACC = [0.9, 0.1, 0.5, 0.7, 0.3]
N = [30, 10, 20, 40, 50]


def test_accuracy_summary_equals_numpy_and_the_documented_rules():
    summary = accuracy_summary(ACC, N)
    assert summary["acc_weighted_mean"] == pytest.approx(np.average(ACC, weights=N))
    assert summary["acc_weighted_mean"] == pytest.approx((27 + 1 + 10 + 28 + 15) / 150)
    assert summary["acc_mean"] == pytest.approx(0.5)
    assert summary["acc_std"] == pytest.approx(np.std(ACC))  # population std, ddof=0
    assert summary["acc_std"] == pytest.approx(np.sqrt(0.08))
    assert summary["acc_min"] == 0.1
    # Linear interpolation at rank (m - 1) q / 100 of the sorted values [0.1, 0.3, 0.5, 0.7, 0.9].
    assert summary["acc_p10"] == pytest.approx(0.1 + 0.4 * 0.2)
    assert summary["acc_p50"] == pytest.approx(0.5)
    assert summary["acc_p90"] == pytest.approx(0.7 + 0.6 * 0.2)
    for q in (10, 50, 90):
        assert summary[f"acc_p{q}"] == pytest.approx(np.percentile(ACC, q))
    assert summary["acc_worst10"] == 0.1  # ceil(5 / 10) = 1 client


def test_loss_summary_takes_the_highest_losses_as_the_worst():
    loss = [2.0, 0.5, 1.0, 4.0, 3.0, 0.1, 0.2, 0.3, 0.4, 0.6, 0.7]  # 11 clients: ceil(11 / 10) = 2 worst
    n = [1] * 10 + [12]
    summary = loss_summary(loss, n)
    assert summary["loss_worst10"] == pytest.approx((4.0 + 3.0) / 2)
    assert summary["loss_max"] == 4.0
    assert summary["loss_mean"] == pytest.approx(np.mean(loss))
    assert summary["loss_weighted_mean"] == pytest.approx(np.average(loss, weights=n))


@pytest.mark.parametrize(("clients", "worst"), [(1, 1), (9, 1), (10, 1), (11, 2), (20, 2), (30, 3), (31, 4), (100, 10)])
def test_worst_count_is_the_ceiling_of_a_tenth_in_integers(clients, worst):
    assert worst_count(clients) == worst  # 30: float ceil(0.1 * 30) would give 4


def test_worst10_mean_on_thirty_clients_averages_the_three_lowest():
    values = np.arange(30, dtype=float)[::-1] / 30
    assert worst10_mean(values, highest=False) == pytest.approx((0 + 1 + 2) / 90)
    assert worst10_mean(values, highest=True) == pytest.approx((29 + 28 + 27) / 90)


@pytest.mark.parametrize(
    ("values", "weights", "match"),
    [([1.0, 2.0], [1.0], "2 values"), ([1.0], [0.0], "positive sum"), ([1.0, 2.0], [1.0, -1.0], ">= 0"), ([], [], "non-empty")],
)
def test_bad_weights_or_values_are_refused(values, weights, match):
    with pytest.raises(ValueError, match=match):
        weighted_mean(values, weights)


def test_worst_count_needs_a_client():
    with pytest.raises(ValueError, match="at least one client, got 0"):
        worst_count(0)


def results(personal: bool = False) -> list[ClientEvaluation]:
    return [
        ClientEvaluation(
            client_id=cid,
            num_samples=n,
            loss=1.0 - acc,
            accuracy=acc,
            personal_loss=(0.5 - acc / 2) if personal and cid != 4 else None,
            personal_accuracy=(acc / 2 + 0.5) if personal and cid != 4 else None,
        )
        for cid, (acc, n) in enumerate(zip(ACC, N))
    ]


def test_summarize_covers_global_and_the_clients_with_an_own_model():
    metrics = summarize(results(personal=True))
    assert metrics["count"] == 5 and metrics["personal/count"] == 4  # client 4 has no own model
    assert metrics["acc_mean"] == pytest.approx(0.5)
    assert metrics["personal/acc_mean"] == pytest.approx(np.mean([a / 2 + 0.5 for a in ACC[:4]]))
    assert metrics["personal/loss_max"] == pytest.approx(max(0.5 - a / 2 for a in ACC[:4]))
    assert metrics["personal/acc_weighted_mean"] == pytest.approx(np.average([a / 2 + 0.5 for a in ACC[:4]], weights=N[:4]))


def test_summarize_without_accuracy_logs_loss_only():
    rows = [ClientEvaluation(client_id=0, num_samples=3, loss=0.25, accuracy=None)]
    assert summarize(rows) == {"count": 1.0, "loss_weighted_mean": 0.25, "loss_mean": 0.25, "loss_max": 0.25, "loss_worst10": 0.25}
    assert summarize([]) == {}


def test_grouped_summary_summarises_each_group_and_skips_unevaluated_ones():
    metrics = grouped_summary(results(), {"odd": [1, 3], "even": [0, 2, 4], "absent": [9]})
    assert metrics["clients/acc_mean"] == pytest.approx(0.5)
    assert metrics["clients/odd/acc_mean"] == pytest.approx((0.1 + 0.7) / 2)
    assert metrics["clients/odd/acc_weighted_mean"] == pytest.approx((0.1 * 10 + 0.7 * 40) / 50)
    assert metrics["clients/even/acc_min"] == pytest.approx(0.3)
    assert metrics["clients/even/count"] == 3
    assert not any(key.startswith("clients/absent/") for key in metrics)


def test_table_rows_have_stable_columns_and_join_overlapping_groups():
    columns, rows = table_rows(7, results(personal=True)[3:], {"a": [3, 4], "b": [4]}, personal=True)
    assert columns == ["round", "client", "group", "n", "loss", "acc", "personal_loss", "personal_acc"]
    assert rows[0] == [7, 3, "a", 40, pytest.approx(0.3), 0.7, pytest.approx(0.15), pytest.approx(0.85)]
    assert rows[1] == [7, 4, "a+b", 50, pytest.approx(0.7), 0.3, None, None]  # no own model yet
    columns, rows = table_rows(0, results()[:1], {}, personal=False)
    assert columns == ["round", "client", "group", "n", "loss", "acc"]
    assert rows == [[0, 0, "", 30, pytest.approx(0.1), 0.9]]
