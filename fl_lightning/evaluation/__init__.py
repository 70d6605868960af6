"""Federated evaluation: per-client metrics on held-out data and their distribution over clients.

The callback is :class:`fl_lightning.FederatedEvaluation`; this package holds its parts: the protocols
algorithms and data implement, per-client scoring, the summaries (pure NumPy) and the table.
"""

from fl_lightning._lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "fl_lightning.evaluation.clients": ("evaluate_clients",),
        "fl_lightning.evaluation.protocols": ("SupportsClientGroups", "SupportsHoldout", "SupportsPersonalizedState"),
        "fl_lightning.evaluation.results": ("ClientEvaluation",),
        "fl_lightning.evaluation.summary": (
            "accuracy_summary", "grouped_summary", "loss_summary", "summarize", "weighted_mean", "worst10_mean",
            "worst_count",
        ),
        "fl_lightning.evaluation.table": ("ClientTable", "table_rows"),
    },
)
