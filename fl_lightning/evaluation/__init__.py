"""Federated evaluation: per-client metrics on held-out data and their distribution over clients.

The callback is :class:`fl_lightning.FederatedEvaluation`; this package holds its parts: the protocols
algorithms and data implement, per-client scoring, the summaries (pure NumPy) and the table.
"""

from fl_lightning.evaluation.clients import evaluate_clients
from fl_lightning.evaluation.protocols import SupportsClientGroups, SupportsHoldout, SupportsPersonalizedState
from fl_lightning.evaluation.results import ClientEvaluation
from fl_lightning.evaluation.summary import (
    accuracy_summary,
    grouped_summary,
    loss_summary,
    summarize,
    weighted_mean,
    worst10_mean,
    worst_count,
)
from fl_lightning.evaluation.table import ClientTable, table_rows

__all__ = [
    "ClientEvaluation",
    "ClientTable",
    "SupportsClientGroups",
    "SupportsHoldout",
    "SupportsPersonalizedState",
    "accuracy_summary",
    "evaluate_clients",
    "grouped_summary",
    "loss_summary",
    "summarize",
    "table_rows",
    "weighted_mean",
    "worst10_mean",
    "worst_count",
]
