"""The one set of quiet ``Trainer`` settings the test suite uses: CPU, no logger, no checkpoints,
no progress bar, no model summary, no sanity validation."""

from __future__ import annotations

from typing import Any

from fl_lightning import FederatedTrainer

QUIET: dict[str, Any] = {
    "accelerator": "cpu",
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
}


def quiet_trainer(**kwargs: Any) -> FederatedTrainer:
    """A ``FederatedTrainer`` with :data:`QUIET` settings, overridden by ``kwargs``."""
    return FederatedTrainer(**{**QUIET, **kwargs})
